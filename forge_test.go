package keylane

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestDeadLetterOfAForgedIDTakesNoOthersPlace: two stored jobs carry the
// same Nats-Msg-Id (the server de-duplicates IDs per jobs stream, and a
// namespace with two shards has two; a raw publisher may aim a message
// with a victim's ID at the other shard), neither asks for its outcome to
// be kept, and both fail. Each must get its own dead letter: a dead
// letter's Nats-Msg-Id was the job's ID, so the dead-letter stream
// dropped the second as a duplicate, and its job was acked as
// dead-lettered with no dead letter stored, a lost job.
func TestDeadLetterOfAForgedIDTakesNoOthersPlace(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, StreamShards: 2})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	for p := range 2 {
		key := keyIn(p, 2, "k")
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, key, nats.Header{HeaderJobID: {"order-7"}, HeaderKey: {key}}, "bad")); err != nil {
			t.Fatalf("publish to partition %d: %v", p, err)
		}
	}
	dls := waitDead(t, e, 2)
	if len(dls) != 2 || dls[0].JobID != "order-7" || dls[1].JobID != "order-7" || dls[0].Key == dls[1].Key {
		t.Fatalf("dead letters %+v; want one of order-7 per key", dls)
	}
}

// TestForgedDelayedIDIsRefused: Keylane-Job-Id names a delayed job's ID
// on the copy the server makes when its schedule fires. From a raw
// publisher on a namespace without delays it would run the message under
// a victim's ID and keep its outcome there: the victim's own queued job
// was then answered with the forger's outcome and acked without running.
// Such a message is dead-lettered, and the victim's job runs.
func TestForgedDelayedIDIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "acct:1", nats.Header{
		HeaderDelayedID: {"victim-1"}, HeaderKey: {"acct:1"}, HeaderKeepOutcome: {"1"},
	}, "forged")); err != nil {
		t.Fatal(err)
	}
	cctx := ctx(t)
	res, err := e.client.Call(cctx, "acct:1", []byte("honest"), WithID("victim-1"))
	if err != nil || string(res) != "ok" || !h.saw("honest") {
		t.Fatalf("the victim's call: %q, %v (ran honest: %v); want it run", res, err, h.saw("honest"))
	}
	if h.saw("forged") {
		t.Fatal("the forged job ran")
	}
	dls := waitDead(t, e, 1)
	if !strings.Contains(dls[0].Error, HeaderDelayedID) || dls[0].JobID != "" {
		t.Fatalf("dead letter %+v; want the forged one, naming no ID", dls[0])
	}
}

// TestForgedBatchIDNeverOverwritesItsEntry: a client that learnt an
// honest batch's ID (its entry's key, batch/<ID>, in the results bucket)
// publishes a batch of its own under that ID (Nats-Msg-Id) on another
// shard's partition, where the server's de-duplication does not reach.
// Its jobs carry the honest jobs' IDs (the batch ID and the index, as the
// worker requires) and ask for their outcomes to be kept. The worker must
// refuse it whole, running none of it: a batch ID's entry belongs to the
// message that earned it. Before, the forged batch ran and its entry
// overwrote the honest one, and a retry by ID of the honest job that was
// dead-lettered got the forger's success.
func TestForgedBatchIDNeverOverwritesItsEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, StreamShards: 2})
	r := newCounter()
	r.poisoned = "poison"
	e.waitOwned(batchWorker(e, "w", r))
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	key := keyIn(0, 2, "seat:")
	done, swallow := queueBehindALostPublish(t, c, nc, p, key, []string{"a", "poison"})
	swallow.Remove()
	for range 3 {
		select {
		case o := <-done:
			if (o.payload == "poison") != (o.err != nil) {
				t.Fatalf("call %s: %q, %v", o.payload, o.res, o.err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a Call never returned")
		}
	}
	testwait.Eventually(t, 10*time.Second, "the honest batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	_, batches := e.resultsKeys()
	_, batchID, outs := leadAndQueued(t, batches, 2) // the honest batch: "a" and "poison"
	var poisonID string
	for _, o := range outs {
		if _, err, _ := decodeResult(o.Value); err != nil {
			poisonID = o.ID
		}
	}
	if poisonID == "" {
		t.Fatalf("the honest entry %v keeps no failed job", outs)
	}
	honest, err := e.topo.Results.Get(ctx(t), wire.BatchOutcomesKey(batchID))
	if err != nil {
		t.Fatal(err)
	}

	// The forgery: the honest batch's ID and its jobs' IDs, on partition
	// 1 (shard 1's stream), every job asking for its outcome to be kept.
	replies, err := e.nc.SubscribeSync("_INBOX.forger.>")
	if err != nil {
		t.Fatal(err)
	}
	forgedKey := keyIn(1, 2, "forged:")
	jobs := make([]wire.BatchJob, len(outs))
	for i := range jobs {
		jobs[i] = wire.BatchJob{Key: forgedKey, ID: wire.BatchedJobID(batchID, i), KeepOutcome: true,
			Reply: "_INBOX.forger." + strconv.Itoa(i), Payload: []byte("forged")}
	}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: wire.BatchSubject(e.ns, 1), Data: body, Header: nats.Header{
		HeaderJobID: {batchID}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"2"}, wire.HeaderBatchJobs: {strconv.Itoa(len(jobs))},
	}}); err != nil {
		t.Fatal(err)
	}
	for i := range jobs {
		m, err := replies.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("forged call %d never answered: %v", i, err)
		}
		if res, rerr := decodeReply(m); rerr == nil {
			t.Errorf("forged call %s answered %q: its batch ran", m.Subject, res)
		}
	}
	testwait.Eventually(t, 10*time.Second, "the forged batch settled", func() bool { return e.streamMsgs(e.topo.Names.JobsShard(1)) == 0 })

	// The honest job that failed, retried by its ID, is told it failed.
	cctx, cancel := context.WithTimeout(ctx(t), 20*time.Second)
	defer cancel()
	res, err := c.Call(cctx, key, []byte("again"), WithID(poisonID))
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered {
		t.Fatalf("retried call of the dead-lettered job %s = %q, %v; want its own dead letter, not the forger's outcome", poisonID, res, err)
	}
	now, err := e.topo.Results.Get(ctx(t), wire.BatchOutcomesKey(batchID))
	if err != nil || now.Revision() != honest.Revision() {
		t.Fatalf("the honest entry was rewritten (revision %d, was %d): %v", now.Revision(), honest.Revision(), err)
	}
	if s := e.stateOf(forgedKey); s != "" {
		t.Fatalf("the forged batch's jobs were applied: state %q", s)
	}
	var forged *DeadLetter
	for _, d := range waitDead(t, e, 2) {
		if strings.Contains(d.Error, "batch ID") {
			forged = &d
		}
	}
	if forged == nil {
		t.Fatal("no dead letter of the forged batch saying why")
	}
}

// TestBatchRewritesItsOwnEntry: a batch whose ID's entry exists and is
// bound to the same message (an earlier owner wrote it, then lost its
// lease before the ack: the message comes again) is not refused: its
// jobs are settled and its entry written again, over the one read.
func TestBatchRewritesItsOwnEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	jobs := make([]wire.BatchJob, 3)
	for i := range jobs {
		jobs[i] = wire.BatchJob{Key: "seat:own", KeepOutcome: true, Reply: "_INBOX.own." + strconv.Itoa(i), Payload: []byte("p" + strconv.Itoa(i))}
	}
	seq := e.publishBatch(0, "own-entry", jobs)
	id := testBatchID("own-entry")
	rev := e.writeEarlierEntry(id, seq)
	r := tagger{newCounter()}
	e.waitOwned(batchWorker(e, "w", r))
	testwait.Eventually(t, 10*time.Second, "the batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters: the batch was refused over its own entry", len(dls))
	}
	e.checkEntryWrittenAgain(id, rev, len(jobs))
}

// TestForgeryAheadLeavesTheHonestCopyItsEntry: a worker reads a batch
// ID's entry off its fetch loop, and runs none of the batch's jobs until
// the read answered. A forged batch under an honest batch's ID, stored on
// the same partition just ahead of a copy of the honest message (whose
// entry an earlier owner wrote, bound to it, before losing its lease),
// must be refused whole once its read answers, and the honest copy,
// received while that read is out, must not be refused with it: its
// claim waits for the forgery's, as the read made in order on receipt
// did. Its jobs run and its entry is written again; the forged jobs never
// run.
func TestForgeryAheadLeavesTheHonestCopyItsEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	// A duplicate window short enough to store two messages of one ID.
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Duplicates = 100 * time.Millisecond
	if _, err := e.js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	calls := func(key, tag string) []wire.BatchJob {
		jobs := make([]wire.BatchJob, 3)
		for i := range jobs {
			jobs[i] = wire.BatchJob{Key: key, KeepOutcome: true, Reply: "_INBOX." + tag + "." + strconv.Itoa(i), Payload: []byte(tag + strconv.Itoa(i))}
		}
		return jobs
	}
	e.publishBatch(0, "ahead", calls("seat:forged", "forged"))
	id := testBatchID("ahead")
	honest := calls("seat:own", "own")
	for i := range honest {
		honest[i].ID = wire.BatchedJobID(id, i)
	}
	body, err := wire.EncodeBatch(honest)
	if err != nil {
		t.Fatal(err)
	}
	var seq uint64
	testwait.Eventually(t, 10*time.Second, "the honest copy stored past the duplicate window", func() bool {
		ack, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: wire.BatchSubject(e.ns, 0), Data: body, Header: nats.Header{
			HeaderJobID: {id}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"1"}, wire.HeaderBatchJobs: {strconv.Itoa(len(honest))},
		}})
		if err != nil || ack.Duplicate {
			return false
		}
		seq = ack.Sequence
		return true
	})
	rev := e.writeEarlierEntry(id, seq)

	e.waitOwned(batchWorker(e, "w", tagger{newCounter()}))
	testwait.Eventually(t, 20*time.Second, "both messages acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	dls := e.deadLetters()
	if len(dls) != 1 || !strings.Contains(dls[0].Header.Get(HeaderError), "batch ID") {
		for _, d := range dls {
			t.Logf("dead letter: %v %q", d.Header, d.Data)
		}
		t.Fatalf("%d dead letters; want the forged batch's alone", len(dls))
	}
	if st := e.stateOf("seat:forged"); st != "" {
		t.Fatalf("the forged batch's jobs were applied: state %q", st)
	}
	e.checkEntryWrittenAgain(id, rev, len(honest))
}

// writeEarlierEntry writes batch id's entry as an earlier owner of
// partition 0 did for the message at stream sequence seq (one outcome,
// bound to that message), and returns its revision.
func (e *env) writeEarlierEntry(id string, seq uint64) uint64 {
	e.t.Helper()
	earlier, err := wire.EncodeBatchOutcomes(id, []wire.BatchOutcome{{Index: 0, ID: wire.BatchedJobID(id, 0), Value: encodeResult([]byte("earlier"), nil, false)}})
	if err != nil {
		e.t.Fatal(err)
	}
	subject := "$KV." + e.topo.Names.Results() + "." + wire.BatchOutcomesKey(id)
	ack, err := e.js.PublishMsg(ctx(e.t), &nats.Msg{Subject: subject, Data: earlier, Header: nats.Header{
		headerBatchOrigin: {batchOrigin(e.topo.Names.Jobs(), e.topo.EpochOf(0), seq)},
	}})
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// checkEntryWrittenAgain fails the test unless batch id's entry was
// written again over revision rev, keeping the outcomes of its jobs.
func (e *env) checkEntryWrittenAgain(id string, rev uint64, jobs int) {
	e.t.Helper()
	entry, err := e.topo.Results.Get(ctx(e.t), wire.BatchOutcomesKey(id))
	if err != nil || entry.Revision() <= rev {
		e.t.Fatalf("entry %v, %v: not written again over revision %d (the batch was refused)", entry, err, rev)
	}
	_, outs, err := wire.DecodeBatchOutcomes(entry.Value())
	if err != nil || len(outs) != jobs {
		e.t.Fatalf("entry keeps %d outcomes (%v), want %d", len(outs), err, jobs)
	}
}

// TestForgedBatchWithAMalformedJobIsDeadLetteredWhole: a forged batch
// (its ID's entry another message's) that also carries a malformed job is
// refused whole, its dead letter holding the whole body, as one whose
// jobs are all valid. The malformed job is not dead-lettered alone first:
// its dead letter would take the whole batch's ID (job 0's dead-letter ID
// is the batch's), and the stream would drop the batch's as a duplicate,
// leaving its valid jobs with no dead letter.
func TestForgedBatchWithAMalformedJobIsDeadLetteredWhole(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	jobs := make([]wire.BatchJob, 3)
	for i := range jobs {
		jobs[i] = wire.BatchJob{Key: "seat:forged", KeepOutcome: true, Reply: "_INBOX.forged." + strconv.Itoa(i), Payload: []byte("f" + strconv.Itoa(i))}
	}
	id := testBatchID("malformed-forged")
	for i := range jobs {
		jobs[i].ID = wire.BatchedJobID(id, i)
	}
	jobs[0].ID = "not-this-batch's" // malformed: a batch's job carries its batch's ID and index
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: wire.BatchSubject(e.ns, 0), Data: body, Header: nats.Header{
		HeaderJobID: {id}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"1"}, wire.HeaderBatchJobs: {strconv.Itoa(len(jobs))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.writeEarlierEntry(id, ack.Sequence+1000) // bound to another message
	e.waitOwned(batchWorker(e, "w", tagger{newCounter()}))
	testwait.Eventually(t, 20*time.Second, "the forged batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	testwait.Eventually(t, 10*time.Second, "a dead letter", func() bool { return len(e.deadLetters()) > 0 })
	dls := e.deadLetters()
	if len(dls) != 1 || !strings.Contains(dls[0].Header.Get(HeaderError), "batch ID") || !bytes.Equal(dls[0].Data, body) {
		for _, d := range dls {
			t.Logf("dead letter: %v %q", d.Header, d.Data)
		}
		t.Fatalf("%d dead letters; want one, of the whole forged batch, saying why", len(dls))
	}
	if st := e.stateOf("seat:forged"); st != "" {
		t.Fatalf("the forged batch's jobs were applied: state %q", st)
	}
}
