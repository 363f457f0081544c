package keylane

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeadLettersRedriveAndPurge: a job that failed permanently is listed
// with its error, redriven once its cause is fixed — the new outcome is
// kept under the original ID, so Result of the original job sees it —
// and the dead letter is gone; Purge empties the rest.
func TestDeadLettersRedriveAndPurge(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var broken atomic.Bool
	broken.Store(true)
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		if broken.Load() {
			return nil, Permanent(errors.New("inventory service down"))
		}
		return []byte("booked " + string(job.Payload)), nil
	}), nil)
	if _, err := e.client.Call(ctx(t), "seat:9", []byte("ann"), WithID("order-1"), WithType("book")); err == nil {
		t.Fatal("the job succeeded while broken")
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	d := dls[0]
	if d.JobID != "order-1" || d.Key != "seat:9" || d.Type != "book" || string(d.Payload) != "ann" || d.Error != "inventory service down" || d.Worker != "w" {
		t.Fatalf("dead letter %+v", d)
	}
	if _, err := e.client.Result(ctx(t), "order-1"); !errors.Is(err, ErrPermanent) {
		t.Fatalf("Result of the dead-lettered job: %v, want its permanent error", err)
	}
	broken.Store(false)
	id, err := e.client.Redrive(ctx(t), d)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the original ID answers with the redriven outcome", func() bool {
		res, err := e.client.Result(ctx(t), "order-1")
		return err == nil && string(res) == "booked ann"
	})
	if res, err := e.client.Result(ctx(t), id); err != nil || string(res) != "booked ann" {
		t.Fatalf("Result of the redriven job %s: %q, %v", id, res, err)
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the redrive: %+v, %v", dls, err)
	}
	broken.Store(true)
	for _, id := range []string{"order-2", "order-3"} {
		_, _ = e.client.Call(ctx(t), "seat:9", []byte("bob"), WithID(id))
	}
	n, err := PurgeDeadLetters(ctx(t), e.js, e.ns)
	if err != nil || n != 2 {
		t.Fatalf("purge: %d, %v; want 2", n, err)
	}
	if _, err := DeadLetterAt(ctx(t), e.js, e.ns, d.Seq); err == nil {
		t.Fatal("a redriven dead letter is still readable")
	}
	if _, err := e.client.Redrive(ctx(t), DeadLetter{Seq: 99, JobID: "x", Key: "k", PayloadDropped: 5}); !errors.Is(err, ErrPayloadDropped) {
		t.Fatalf("redrive of a dropped payload: %v", err)
	}
}

// TestRedriveWithoutJobID: a dead letter whose job came without an ID (a
// producer that sent no Nats-Msg-Id) is redriven under an ID derived from
// its sequence and partition; one of a delayed job (whose Nats-Msg-Id the
// server strips; its ID travels in Keylane-Job-Id) carries that ID, and
// its redrive answers under it.
func TestRedriveWithoutJobID(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var broken atomic.Bool
	broken.Store(true)
	var ran atomic.Int64
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		if broken.Load() {
			return nil, Permanent(errors.New("down"))
		}
		ran.Add(1)
		return []byte("done " + string(job.Payload)), nil
	}), nil)
	m := nats.NewMsg(partition.Subject(e.ns, partition.Of("k", 2), "k"))
	m.Header.Set(HeaderKey, "k")
	m.Data = []byte("p")
	if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	// A delayed job: its ID comes back in Keylane-Job-Id, from the schedule.
	if _, err := e.client.Submit(ctx(t), "k", []byte("pdelayed-7"), WithID("delayed-7"), WithDelay(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "two dead letters", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 2
	})
	broken.Store(false)
	var ids []string
	for _, d := range dls {
		id, err := e.client.Redrive(ctx(t), d)
		if err != nil {
			t.Fatalf("redrive of dead letter %d (job %q): %v", d.Seq, d.JobID, err)
		}
		again, err := e.client.Redrive(ctx(t), d)
		if err != nil || again != id {
			t.Fatalf("the same dead letter redriven again: %q, %v; want %q (one job)", again, err, id)
		}
		ids = append(ids, id)
	}
	if dls[0].JobID != "" || dls[1].JobID != "delayed-7" {
		t.Fatalf("dead letters' job IDs %q and %q, want none and delayed-7", dls[0].JobID, dls[1].JobID)
	}
	if !strings.HasPrefix(ids[0], "redrive-p"+strconv.Itoa(dls[0].Partition)+"-"+strconv.FormatUint(dls[0].Seq, 10)+"-") {
		t.Fatalf("the ID-less dead letter was redriven as %q", ids[0])
	}
	testwait.Eventually(t, 10*time.Second, "both redriven jobs ran", func() bool {
		a, err1 := e.client.Result(ctx(t), ids[0])
		b, err2 := e.client.Result(ctx(t), "delayed-7")
		return err1 == nil && err2 == nil && string(a) == "done p" && string(b) == "done pdelayed-7"
	})
	if n := ran.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the redrives: %+v, %v", dls, err)
	}
}

// TestRedriveOfAWholeBatchDeadLetter: a batch message dead-lettered whole
// (here fetched by a worker that does not read batches) is redriven job
// by job: each job goes to its own key's partition (the batch was on
// partition 0, one key belongs to partition 1) with its type, header and
// payload, and its outcome is kept under its batch ID too; the dead
// letter goes only once every job is stored. A first redrive that stores
// one job and is refused for the next (its key full) leaves the dead
// letter, and the redrive run again stores the rest and not the first
// twice. A batch holding a job no client could send (an empty key) and a
// batch whose body does not decode are refused, nothing stored, the dead
// letters left. Before, every such redrive failed ("partition: key is
// empty"): the key was read from Keylane-Key, which a batch has none of.
func TestRedriveOfAWholeBatchDeadLetter(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, MaxKeyBacklog: 1})
	a, b := keyIn(0, 2, "seat:a"), keyIn(1, 2, "seat:b")
	type run struct {
		key, typ, tag, id  string
		partition, attempt int
	}
	var mu sync.Mutex
	var runs []run
	release, blocking := make(chan struct{}), make(chan struct{}, 1)
	e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		if string(j.Payload) == "block" {
			blocking <- struct{}{}
			<-release
			return nil, nil
		}
		mu.Lock()
		runs = append(runs, run{j.Key, j.Type, j.Headers.Get("X-Tag"), j.ID, j.Partition, j.Attempt})
		mu.Unlock()
		return []byte("done " + string(j.Payload)), nil
	}), nil)
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free) // before the worker's stop, which waits for the handler
	batchID := testBatchID("whole")
	e.publishBatch(0, "whole", []wire.BatchJob{
		{Key: a, Type: "book", Header: map[string][]string{"X-Tag": {"t0"}}, Payload: []byte("a0")},
		{Key: b, Payload: []byte("b0")},
		{Key: a, Payload: []byte("a1")},
	})
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "the batch dead-lettered whole", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	d := dls[0]
	if d.Key != "" || d.JobID != batchID {
		t.Fatalf("the whole batch's dead letter names key %q, job %q", d.Key, d.JobID)
	}

	// Key b full (its one job running, unacked): the redrive stores a0,
	// is refused for b0, and leaves the dead letter.
	if _, err := e.client.Submit(ctx(t), b, []byte("block")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocking:
	case <-ctx(t).Done():
		t.Fatal("the blocking job never ran")
	}
	_, err := e.client.Redrive(ctx(t), d)
	wantFull(t, "a batch's redrive into a full key", err, b, 1)
	if again, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(again) != 1 {
		t.Fatalf("dead letters after the refused redrive: %d, %v; want it kept", len(again), err)
	}
	free()
	var ids string
	testwait.NoError(t, 10*time.Second, "the batch redriven once key b has room", func() error {
		ids, err = e.client.Redrive(ctx(t), d)
		return err
	})
	jobs, err := d.RedriveJobs()
	if err != nil || len(jobs) != 3 {
		t.Fatalf("RedriveJobs: %d jobs, %v", len(jobs), err)
	}
	var want []string
	for i, j := range jobs {
		if j.Index != i || j.Of != wire.BatchedJobID(batchID, i) {
			t.Fatalf("job %d redriven as %+v", i, j)
		}
		want = append(want, j.ID)
	}
	if ids != strings.Join(want, ",") {
		t.Fatalf("Redrive returned %q, want the jobs' new IDs %q", ids, want)
	}
	if again, err := e.client.Redrive(ctx(t), d); err != nil || again != ids {
		t.Fatalf("the batch redriven again: %q, %v; want %q, nothing stored", again, err, ids)
	}
	for i, payload := range []string{"a0", "b0", "a1"} {
		testwait.Eventually(t, 10*time.Second, "job "+payload+" answers under both IDs", func() bool {
			r1, err1 := e.client.Result(ctx(t), jobs[i].ID)
			r2, err2 := e.client.Result(ctx(t), jobs[i].Of)
			return err1 == nil && err2 == nil && string(r1) == "done "+payload && string(r2) == "done "+payload
		})
	}
	mu.Lock()
	got := slices.Clone(runs)
	mu.Unlock()
	wantRuns := []run{
		{a, "book", "t0", jobs[0].ID, 0, 1},
		{b, "", "", jobs[1].ID, 1, 1},
		{a, "", "", jobs[2].ID, 0, 1},
	}
	slices.SortFunc(got, func(x, y run) int { return strings.Compare(x.id, y.id) })
	slices.SortFunc(wantRuns, func(x, y run) int { return strings.Compare(x.id, y.id) })
	if !slices.Equal(got, wantRuns) {
		t.Fatalf("runs %+v, want each job once: %+v", got, wantRuns)
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the redrive: %+v, %v", dls, err)
	}

	// A job no client could send (an empty key): the batch is refused
	// before anything is stored. A body that does not decode: refused.
	e.publishBatch(0, "badjob", []wire.BatchJob{{Key: a, Payload: []byte("x0")}, {Key: "", Payload: []byte("x1")}})
	m := nats.NewMsg(wire.BatchSubject(e.ns, 1)) // (the key cap counts a batch subject too)
	m.Header.Set(HeaderJobID, testBatchID("garbled"))
	m.Header.Set(wire.HeaderBatch, "1")
	m.Data = []byte("KLB\x01\x05garbled")
	if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "both dead-lettered whole", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 2
	})
	if dls[0].JobID != testBatchID("badjob") { // (two partitions: either may come first)
		dls[0], dls[1] = dls[1], dls[0]
	}
	if _, err := e.client.Redrive(ctx(t), dls[0]); err == nil || !strings.Contains(err.Error(), "job 1 of the batch") || !errors.Is(err, partition.ErrEmptyKey) {
		t.Fatalf("redrive of a batch with an empty key: %v", err)
	}
	if _, err := e.client.Redrive(ctx(t), dls[1]); !errors.Is(err, ErrMalformedBatch) || !strings.Contains(err.Error(), "this dead letter is a malformed batch: nothing to redrive") {
		t.Fatalf("redrive of a garbled batch: %v, want ErrMalformedBatch", err)
	}
	if again, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(again) != 2 {
		t.Fatalf("dead letters after the refused redrives: %d, %v; want both kept", len(again), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != 3 {
		t.Fatalf("%d runs: a refused batch's redrive stored a job (%+v)", len(runs), runs[3:])
	}
}

// TestRedriveGoesAsABatchOfOneAndRunsOnce: a redrive travels in the one
// format, a batch of one carrying Keylane-Redrive-Of on the message,
// under a batch ID of its own; redriven twice, it is stored twice and
// runs once (the worker looks its ID up before running it), its outcome
// kept under both IDs. (Before the one path: a one-job message under the
// redrive's ID, which the server de-duplicated.)
func TestRedriveGoesAsABatchOfOneAndRunsOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	failing := e.worker("w1", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		return nil, Permanent(errors.New("inventory service down"))
	}), nil)
	if _, err := e.client.Call(ctx(t), "seat:9", []byte("ann"), WithID("order-1")); err == nil {
		t.Fatal("the job succeeded")
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	if err := failing.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 2 {
		id, err := e.client.Redrive(ctx(t), dls[0])
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if ids[0] != ids[1] {
		t.Fatalf("two redrives of one dead letter gave IDs %q and %q", ids[0], ids[1])
	}
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); ; seq++ {
		m, err := s.GetMsg(ctx(t), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			if seq < 3 {
				continue // the dead-lettered call, acked
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(wire.HeaderBatch) != "1" || m.Header.Get(wire.HeaderBatchJobs) != "1" || m.Header.Get(HeaderRedriveOf) != "order-1" || m.Header.Get(HeaderJobID) == ids[0] {
			t.Fatalf("stored redrive %d: headers %v; want a batch of one with Keylane-Redrive-Of, under its own batch ID", seq, m.Header)
		}
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 2 {
		t.Fatalf("%d messages stored, want both redrives", n)
	}
	var runs atomic.Int32
	e.worker("w2", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		runs.Add(1)
		return []byte("booked " + string(job.Payload)), nil
	}), nil)
	testwait.Eventually(t, 20*time.Second, "both redrives acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("the redriven job ran %d times, want once", n)
	}
	for _, id := range []string{"order-1", ids[0]} {
		if res, err := e.client.Result(ctx(t), id); err != nil || string(res) != "booked ann" {
			t.Fatalf("Result(%s) = %q, %v; want the redriven outcome", id, res, err)
		}
	}
}
