package keylane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestStaleBatchingClientCallsEndPromptly: a batching client opened
// before a repartition 2 → 4 still routes with N = 2 and batches its
// concurrent Calls; the worker dead-letters each such batch whole (its
// Keylane-Partitions is not the stream's). Every Call must end promptly
// with ErrPartitionMismatch, so its caller knows to open the client
// again, never wait out its deadline; and no job of a stale batch runs.
func TestStaleBatchingClientCallsEndPromptly(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	stale, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	// No worker runs during the change: a stream update racing a
	// consumer's creation trips a data race inside nats-server under
	// -race (see env.worker).
	if err := Repartition(ctx(t), e.js, e.ns, 4, nil); err != nil {
		t.Fatal(err)
	}
	r := newCounter()
	w := e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer = nil, r
		c.Topology.Partitions = 4
	})
	testwait.Eventually(t, 30*time.Second, "the worker owns all 4 partitions", func() bool {
		owned := w.Owned()
		slices.Sort(owned)
		return w.Topology().Partitions == 4 && slices.Equal(owned, []int{0, 1, 2, 3})
	})
	batches, err := e.nc.SubscribeSync(e.ns + ".jobs.*.batch")
	if err != nil {
		t.Fatal(err)
	}
	// 64 concurrent Calls on keys of partition 0 under N = 2: the client
	// sends the first alone and batches the others behind it.
	const calls, deadline = 64, 20 * time.Second
	errs, took := make([]error, calls), make([]time.Duration, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			_, errs[i] = stale.Call(cctx, keyIn(0, 2, fmt.Sprintf("seat-%d-", i%8)), []byte(strconv.Itoa(i)))
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	if n, _, _ := batches.Pending(); n == 0 {
		t.Fatal("the stale client sent no batch message (64 concurrent Calls of one partition)")
	} else {
		t.Logf("64 stale Calls, %d batch messages among them", n)
	}
	t.Logf("a stale Call: %v", errs[0])
	for i, err := range errs {
		if !errors.Is(err, ErrPartitionMismatch) || took[i] > deadline/2 {
			t.Fatalf("stale Call %d ended after %v with %v; want ErrPartitionMismatch promptly (its deadline is %v)", i, took[i].Round(time.Millisecond), err, deadline)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) != 0 {
		t.Fatalf("%d jobs of a stale client applied, want none", len(r.applied))
	}
}

// TestBatchDeadLetteredWholeAnswersItsCalls: a batch message dead-lettered
// whole whose body still decodes (here: routed with another partition
// count to a worker with Batches, and any batch to a worker without)
// answers every job of it that names a reply subject under the reply
// prefix with the refusal, and no other subject; no job of it runs.
func TestBatchDeadLetteredWholeAnswersItsCalls(t *testing.T) {
	for _, tc := range []struct {
		name       string
		batches    bool
		partitions string
		why        string
	}{
		{"another partition count", true, "2", "routed by a client that counts 2 partitions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1, ReplyPrefix: "rp.test."})
			var ran sync.Map
			e.waitOwned(e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
				ran.Store(j.ID, true)
				return []byte("ok"), nil
			}), nil))
			inside, err := e.nc.SubscribeSync("rp.test.>")
			if err != nil {
				t.Fatal(err)
			}
			outside, err := e.nc.SubscribeSync("elsewhere.>")
			if err != nil {
				t.Fatal(err)
			}
			id := testBatchID("stale-" + tc.name)
			jobs := []wire.BatchJob{
				{Key: "seat:a", Reply: "rp.test.c1.-1", KeepOutcome: true},
				{Key: "seat:b", Reply: "rp.test.c1.-2", KeepOutcome: true},
				{Key: "seat:c"}, // a Submit: nobody to tell
				{Key: "seat:d", Reply: "elsewhere.c1.-3"}, // outside the prefix: never told
				{Key: "seat:e", Reply: "rp.test.*"},       // a wildcard: never told
			}
			for i := range jobs {
				jobs[i].ID = wire.BatchedJobID(id, i)
			}
			body, err := wire.EncodeBatch(jobs)
			if err != nil {
				t.Fatal(err)
			}
			m := &nats.Msg{Subject: wire.BatchSubject(e.ns, 0), Data: body, Header: nats.Header{
				HeaderJobID: {id}, wire.HeaderBatch: {"1"}, HeaderPartitions: {tc.partitions}, wire.HeaderBatchJobs: {strconv.Itoa(len(jobs))},
			}}
			if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
				t.Fatal(err)
			}
			got := map[string]*nats.Msg{}
			for len(got) < 2 {
				m, err := inside.NextMsg(10 * time.Second)
				if err != nil {
					t.Fatalf("replies to the batch's Calls: %d of 2 within 10s (%v); want each told why its batch was refused", len(got), err)
				}
				got[m.Subject] = m
			}
			for _, subj := range []string{"rp.test.c1.-1", "rp.test.c1.-2"} {
				m := got[subj]
				if m == nil {
					t.Fatalf("no reply on %s; got %v", subj, slices.Collect(maps.Keys(got)))
				}
				_, err := decodeReply(m)
				var re *RemoteError
				if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, tc.why) {
					t.Fatalf("reply on %s: %v; want a dead-lettered refusal saying %q", subj, err, tc.why)
				}
			}
			testwait.Eventually(t, 10*time.Second, "the batch dead-lettered whole and acked", func() bool {
				return len(e.deadLetters()) == 1 && e.streamMsgs(e.topo.Names.Jobs()) == 0
			})
			if m, err := inside.NextMsg(200 * time.Millisecond); err == nil {
				t.Fatalf("a third reply inside the prefix: %s %v", m.Subject, m.Header)
			}
			if m, err := outside.NextMsg(10 * time.Millisecond); err == nil {
				t.Fatalf("a reply outside the reply prefix: %s %v", m.Subject, m.Header)
			}
			ran.Range(func(k, _ any) bool { t.Fatalf("job %v of a refused batch ran", k); return false })
		})
	}
}

// publishRawBatch stores jobs as one batch message on subject, as a raw
// publisher with a client's rights may send it (partition count n), each
// job's ID sealed to the batch's (name), and returns the batch's ID.
func (e *env) publishRawBatch(subject, name string, n int, jobs []wire.BatchJob) string {
	e.t.Helper()
	id := testBatchID(name)
	for i := range jobs {
		jobs[i].ID = wire.BatchedJobID(id, i)
	}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		e.t.Fatal(err)
	}
	m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{
		HeaderJobID: {id}, wire.HeaderBatch: {"1"}, HeaderPartitions: {strconv.Itoa(n)}, wire.HeaderBatchJobs: {strconv.Itoa(len(jobs))},
	}}
	if _, err := e.js.PublishMsg(ctx(e.t), m); err != nil {
		e.t.Fatalf("publish of batch %s on %s: %v", name, subject, err)
	}
	return id
}

// TestKeyBacklogCapHoldsForBatches: on a namespace with MaxKeyBacklog, the
// server counts a key's jobs by its subject, so a batch message counts
// only on its key's subject and only as one job. A raw publisher puts 50
// jobs of a full key into one message on the partition's batch subject:
// the worker must refuse it whole (dead-lettered with its reason, its
// Calls told) and run none of them. A batch of two jobs on the key's
// subject and a one-job batch on another key's subject are refused the
// same way; a one-job batch on its key's own subject runs.
func TestKeyBacklogCapHoldsForBatches(t *testing.T) {
	const limit = 3
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: limit, ReplyPrefix: "rp.test."})
	full, other, lone := "sku:full", "sku:other", "sku:lone"
	for i := range limit {
		if _, err := e.client.Submit(ctx(t), full, []byte("buy")); err != nil {
			t.Fatalf("job %d of %d: %v", i+1, limit, err)
		}
	}
	_, err := e.client.Submit(ctx(t), full, []byte("buy"))
	wantFull(t, "Submit over the cap", err, full, limit)
	replies, err := e.nc.SubscribeSync("rp.test.>")
	if err != nil {
		t.Fatal(err)
	}
	var fifty []wire.BatchJob
	for i := range 50 {
		fifty = append(fifty, wire.BatchJob{Key: full, Reply: "rp.test.raw.-" + strconv.Itoa(i), KeepOutcome: true, Payload: []byte("buy")})
	}
	e.publishRawBatch(wire.BatchSubject(e.ns, 0), "fifty", 1, fifty)
	e.publishRawBatch(partition.Subject(e.ns, 0, other), "two", 1, []wire.BatchJob{
		{Key: other, Reply: "rp.test.raw.-two-0", KeepOutcome: true}, {Key: other, Reply: "rp.test.raw.-two-1", KeepOutcome: true},
	})
	e.publishRawBatch(partition.Subject(e.ns, 0, other), "mismatched", 1, []wire.BatchJob{{Key: lone, Reply: "rp.test.raw.-mismatched", KeepOutcome: true}})
	loneID := e.publishRawBatch(partition.Subject(e.ns, 0, lone), "lone", 1, []wire.BatchJob{{Key: lone, Reply: "rp.test.raw.-lone", KeepOutcome: true}})

	r := newCounter()
	e.waitOwned(e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r }))
	testwait.Eventually(t, 20*time.Second, "every job settled (the stream empty)", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	if got := e.stateOf(full); got != strconv.Itoa(limit) {
		t.Fatalf("key %s's state is %q: %s jobs of a key capped at %d ran; want %d (the batch of 50 on the batch subject refused)", full, got, got, limit, limit)
	}
	if got := e.stateOf(other); got != "" {
		t.Fatalf("key %s's state is %q; want no job of it run (a batch of two jobs, and one of another key's job, on its subject)", other, got)
	}
	if got := e.stateOf(lone); got != "1" {
		t.Fatalf("key %s's state is %q; want 1: its one-job batch on its own subject runs, the one on another key's subject not", lone, got)
	}
	got := map[string]error{}
	for len(got) < 50+2+1+1 {
		m, err := replies.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d replies within 10s: %v", len(got), 54, err)
		}
		_, got[m.Subject] = decodeReply(m)
	}
	for subj, err := range got {
		if subj == "rp.test.raw.-lone" {
			if err != nil {
				t.Fatalf("the lone job %s: %v", wire.BatchedJobID(loneID, 0), err)
			}
			continue
		}
		var re *RemoteError
		if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "key backlog cap") {
			t.Fatalf("reply on %s: %v; want a dead-lettered refusal naming the key backlog cap", subj, err)
		}
	}
	dls := waitDead(t, e, 3)
	for _, d := range dls {
		t.Logf("dead letter: %s", d.Error)
	}
	if len(dls) != 3 {
		t.Fatalf("%d dead letters, want 3 (each refused batch whole)", len(dls))
	}
}
