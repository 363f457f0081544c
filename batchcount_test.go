package keylane

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBacklogCountsJobsOfBatches: a batch message of 50 jobs counts 50 in
// Client.Backlog and in Inspect's Pending (the status page's backlog),
// before and after the partition's consumer delivered the messages ahead
// of it, and 0 once delivered.
func TestBacklogCountsJobsOfBatches(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	for i := range 2 {
		if _, err := e.client.Submit(ctx(t), "seat:"+strconv.Itoa(i), []byte("alone")); err != nil {
			t.Fatal(err)
		}
	}
	var jobs []wire.BatchJob
	for i := range 50 {
		jobs = append(jobs, wire.BatchJob{Key: "seat:" + strconv.Itoa(i%7), ID: "b-" + strconv.Itoa(i), Payload: []byte("x")})
	}
	e.publishBatch(0, "batch-50", jobs)
	if _, err := e.client.Submit(ctx(t), "seat:9", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if n, err := e.client.Backlog(ctx(t)); err != nil || n != 53 {
		t.Fatalf("Backlog = %d, %v; want 53 (3 one-job messages and a batch of 50)", n, err)
	}
	if n, err := e.client.Stored(ctx(t)); err != nil || n != 4 {
		t.Fatalf("Stored = %d, %v; want 4 messages (3 batches of one and a batch of 50)", n, err)
	}
	cons, err := e.topo.Jobs.CreateOrUpdateConsumer(ctx(t), e.topo.consumerConfig(0, 30*time.Second, 16))
	if err != nil {
		t.Fatal(err)
	}
	pending := func() uint64 {
		t.Helper()
		st, err := Inspect(ctx(t), e.js, e.ns)
		if err != nil {
			t.Fatal(err)
		}
		return st.Partition[0].Pending
	}
	// Each delivery takes its message out of Pending: a one-job message
	// one job, the batch its 50.
	for _, want := range []uint64{53, 52, 51, 1, 0} {
		if got := pending(); got != want {
			t.Fatalf("Inspect's Pending = %d, want %d", got, want)
		}
		if want == 0 {
			break
		}
		msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for range msgs.Messages() {
		}
		if msgs.Error() != nil {
			t.Fatal(msgs.Error())
		}
	}
	// Delivered, not acked: still in the stream, so still in Backlog.
	if n, err := e.client.Backlog(ctx(t)); err != nil || n != 53 {
		t.Fatalf("Backlog = %d, %v; want 53", n, err)
	}
	// Once the messages leave the stream (purged here), Stored is zero.
	if err := e.topo.Jobs.Purge(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n, err := e.client.Stored(ctx(t)); err != nil || n != 0 {
		t.Fatalf("Stored after the stream emptied = %d, %v; want 0", n, err)
	}
}

// TestBatchWithAWrongJobCountIsDeadLetteredWhole: a batch whose
// Keylane-Batch-Jobs is missing or differs from its body's count would
// be miscounted by every backlog; the worker dead-letters it whole,
// running none of its jobs.
func TestBatchWithAWrongJobCountIsDeadLetteredWhole(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	batchWorker(e, "w", r)
	jobs := []wire.BatchJob{{Key: "seat:1", ID: "j1"}, {Key: "seat:2", ID: "j2"}}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i, count := range []string{"3", ""} {
		h := nats.Header{HeaderJobID: {testBatchID("batch" + strconv.Itoa(i))}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"1"}}
		if count != "" {
			h[wire.HeaderBatchJobs] = []string{count}
		}
		if _, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: wire.BatchSubject(e.ns, 0), Data: body, Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 10*time.Second, "both batches dead-lettered", func() bool {
		return len(e.deadLetters()) == 2
	})
	for _, d := range e.deadLetters() {
		if reason := d.Header.Get(wire.HeaderError); !strings.Contains(reason, "Keylane-Batch-Jobs") {
			t.Fatalf("dead letter's reason %q, want it to name Keylane-Batch-Jobs", reason)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) != 0 {
		t.Fatalf("jobs of a miscounted batch applied: %v", r.applied)
	}
}

// TestWorkerBacklogCountsJobsOfBatches: the worker's backlog
// (Tenure.Backlog, the keylane_partition_backlog metric) counts a batch
// message not yet delivered as its 50 jobs. Two jobs that do not finish
// are ahead of a batch of 50 and a job: the first fills the partition's
// in-flight window (MaxInFlight 1: every job counts in it, whatever
// message it came in), the second waits with the server's window full
// (MaxPending 2 messages), so the backlog is 52 (the second, the batch's
// 50 and the last), and 0 once everything ran. The two are batches of
// one, as Submit sends them.
func TestWorkerBacklogCountsJobsOfBatches(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	for _, key := range []string{"held:a", "held:b"} {
		if _, err := e.client.Submit(ctx(t), key, []byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	var jobs []wire.BatchJob
	for i := range 50 {
		jobs = append(jobs, wire.BatchJob{Key: "seat:" + strconv.Itoa(i%7), ID: "b-" + strconv.Itoa(i), Payload: []byte("x")})
	}
	e.publishBatch(0, "batch-50", jobs)
	if _, err := e.client.Submit(ctx(t), "seat:9", []byte("after")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var ran atomic.Int64
	w := e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		if string(j.Payload) == "held" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ran.Add(1)
		return nil, nil
	}), func(c *WorkerConfig) { c.MaxInFlight, c.MaxPending = 1, 2 })
	backlog := func() uint64 {
		ts := w.Tenures()
		if len(ts) != 1 {
			return 1 << 62
		}
		return ts[0].Backlog
	}
	testwait.Eventually(t, 10*time.Second, "the backlog counts the batch's 50 jobs", func() bool { return backlog() == 52 })
	close(release)
	testwait.Eventually(t, 20*time.Second, "every job run", func() bool { return ran.Load() == 53 })
	testwait.Eventually(t, 10*time.Second, "the backlog empty", func() bool { return backlog() == 0 })
}
