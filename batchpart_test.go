package keylane

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/core"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// publishBatch stores jobs as one batch message of partition p, as a
// client of this release will send it, and returns its stream sequence.
// name makes the batch's ID (testBatchID), and each job's ID is made its
// batch's and index's (wire.BatchedJobID), as the client seals them and
// the worker requires; the tests name a job by the ID they wrote, which
// sealedNames maps back.
func (e *env) publishBatch(p int, name string, jobs []wire.BatchJob) uint64 {
	e.t.Helper()
	id := testBatchID(name)
	for i := range jobs {
		jobs[i].ID = wire.BatchedJobID(id, i)
	}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		e.t.Fatal(err)
	}
	m := &nats.Msg{Subject: wire.BatchSubject(e.ns, p), Data: body, Header: nats.Header{
		HeaderJobID: {id}, wire.HeaderBatch: {"1"}, HeaderPartitions: {"1"}, wire.HeaderBatchJobs: {strconv.Itoa(len(jobs))},
	}}
	ack, err := e.js.PublishMsg(ctx(e.t), m)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// testBatchID makes a valid batch ID (wire.ValidBatchID) of a test's
// name for its batch: its letters and digits, padded with Z.
func testBatchID(name string) string {
	var b []byte
	for i := 0; i < len(name) && len(b) < wire.BatchIDLen; i++ {
		if c := name[i]; 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			b = append(b, c)
		}
	}
	for len(b) < wire.BatchIDLen {
		b = append(b, 'Z') // not a digit: "x-1" and "x-10" stay apart
	}
	return string(b)
}

// sealedNames maps the IDs publishBatch gives the jobs of batch name
// back to the names the test wrote (names[i] is job i's).
func sealedNames(name string, names ...string) map[string]string {
	m := make(map[string]string, len(names))
	for i, n := range names {
		m[wire.BatchedJobID(testBatchID(name), i)] = n
	}
	return m
}

// renamed is counts with each sealed ID replaced by its name.
func renamed(counts map[string]int, names map[string]string) map[string]int {
	out := make(map[string]int, len(counts))
	for id, n := range counts {
		if name, ok := names[id]; ok {
			id = name
		}
		out[id] += n
	}
	return out
}

func batchWorker(e *env, id string, r Reducer) *Worker {
	return e.worker(id, nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
}

// stateOf returns key's state value, "" when none.
func (e *env) stateOf(key string) string {
	e.t.Helper()
	entry, err := NewState(e.topo.State).Get(ctx(e.t), key)
	if err != nil {
		return ""
	}
	return string(entry.Value)
}

// TestBatchMixingKeysWithDifferentFates: one batch message carries jobs
// of three keys and a job that breaks a rule. The poisoned job is
// dead-lettered alone, the malformed one too, every other job is applied
// once in its key's order, and the batch message is acked once all are
// settled.
func TestBatchMixingKeysWithDifferentFates(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	r.poisoned = "poison"
	batchWorker(e, "w", r)
	seq := e.publishBatch(0, "batch-1", []wire.BatchJob{
		{Key: "seat:a", ID: "a1", Payload: []byte("1")},
		{Key: "seat:b", ID: "p1", Payload: []byte("poison")},
		{Key: "seat:a", ID: "a2", Payload: []byte("2")},
		{Key: "seat:c", ID: "c1", Payload: []byte("3")},
		{Key: " seat:d", ID: "x1", Payload: []byte("4")}, // white space: malformed
		{Key: "seat:b", ID: "b2", Payload: []byte("5")},
	})
	testwait.Eventually(t, 10*time.Second, "the batch message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	names := sealedNames("batch-1", "a1", "p1", "a2", "c1", "x1", "b2")
	r.mu.Lock()
	applied := renamed(r.applied, names)
	r.mu.Unlock()
	for _, id := range []string{"a1", "a2", "c1", "b2"} {
		if applied[id] != 1 {
			t.Errorf("job %s applied %d times, want once", id, applied[id])
		}
	}
	if applied["p1"] != 0 || applied["x1"] != 0 {
		t.Errorf("refused jobs applied: %v", applied)
	}
	if a, b, c := e.stateOf("seat:a"), e.stateOf("seat:b"), e.stateOf("seat:c"); a != "2" || b != "1" || c != "1" {
		t.Errorf("states a=%q b=%q c=%q, want 2, 1, 1", a, b, c)
	}
	dls := e.deadLetters()
	var ids, why, own []string
	for _, d := range dls {
		ids = append(ids, names[wire.JobIDOfDead(d.Header)])
		why = append(why, d.Header.Get(HeaderError))
		own = append(own, d.Header.Get(HeaderJobID))
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"p1", "x1"}) {
		t.Fatalf("dead letters of %v, want p1 and x1 (errors %q)", ids, why)
	}
	if own[0] == own[1] || !strings.HasPrefix(own[0], "dl-") {
		t.Fatalf("dead letters' own IDs %q: two jobs of one batch share one", own)
	}
	for _, d := range dls {
		if id := names[wire.JobIDOfDead(d.Header)]; id == "x1" && !strings.Contains(d.Header.Get(HeaderError), "malformed: bad key") ||
			id == "p1" && (d.Header.Get(HeaderKey) != "seat:b" || string(d.Data) != "poison" || d.Header.Get(HeaderSeq) != itoa(seq)) {
			t.Fatalf("dead letter of %s: %v %q", id, d.Header, d.Data)
		}
	}
}

// TestBatchRedeliveredAfterCrashBetweenApplyAndAck: a worker applies
// every job of a batch but dies before the batch message is acked (one
// job's state is written, its ack never sent). The next owner gets the
// whole batch again and settles it job by job from the held outcomes:
// nothing applied twice, nothing skipped, the message acked.
func TestBatchRedeliveredAfterCrashBetweenApplyAndAck(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	names := sealedNames("batch-1", "a1", "b1", "a2")
	r := &blockOn{counter: newCounter(), id: wire.BatchedJobID(testBatchID("batch-1"), 1), hit: make(chan struct{}), release: make(chan struct{})}
	w1 := batchWorker(e, "w1", r)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(r.release) }) }
	t.Cleanup(release) // before w1's Stop (cleanups run last first): a failed test frees the runner
	e.waitOwned(w1)
	e.publishBatch(0, "batch-1", []wire.BatchJob{
		{Key: "seat:a", ID: "a1", Payload: []byte("1")},
		{Key: "seat:b", ID: "b1", Payload: []byte("2")},
		{Key: "seat:a", ID: "a2", Payload: []byte("3")},
	})
	testwait.Until(t, 10*time.Second, "job b1 applied", func() (struct{}, bool) {
		select {
		case <-r.hit:
			return struct{}{}, true
		default:
			return struct{}{}, false
		}
	})
	testwait.Eventually(t, 10*time.Second, "seat:a's jobs settled", func() bool { return w1.Stats().Succeeded == 2 })
	// The crash: w1's connection goes, so b1's ack (the batch message's)
	// is never sent; its lease expires.
	w1.nc.Close()
	release()
	if e.streamMsgs(e.topo.Names.Jobs()) != 1 {
		t.Fatal("the batch message was acked before every job of it was")
	}
	w2 := batchWorker(e, "w2", r.counter)
	testwait.Eventually(t, 15*time.Second, "the redelivered batch acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	r.mu.Lock()
	applied := renamed(r.applied, names)
	r.mu.Unlock()
	if applied["a1"] != 1 || applied["a2"] != 1 || applied["b1"] != 1 {
		t.Fatalf("applied %v, want each job once", applied)
	}
	if a, b := e.stateOf("seat:a"), e.stateOf("seat:b"); a != "2" || b != "1" {
		t.Fatalf("states a=%q b=%q, want 2 and 1", a, b)
	}
	if s := w2.Stats(); s.DeadLettered != 0 {
		t.Fatalf("the new owner dead-lettered %d jobs", s.DeadLettered)
	}
}

// blockOn is a counter that, once, holds the runner after job id was
// applied (its state written) and before it is acked.
type blockOn struct {
	*counter
	id      string
	once    sync.Once
	hit     chan struct{}
	release chan struct{}
}

func (b *blockOn) Committed(j Job, applied bool) {
	b.counter.Committed(j, applied)
	if j.ID == b.id && applied {
		b.once.Do(func() {
			close(b.hit)
			<-b.release
		})
	}
}

func (b *blockOn) Reduce(ctx context.Context, j Job, cur []byte) ([]byte, []byte, error) {
	return b.counter.Reduce(ctx, j, cur)
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func itoa(n uint64) string {
	const digits = "0123456789"
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{digits[n%10]}, b...)
	}
	return string(b)
}

// TestStateAppliesJobsOfOneBatchInOrder: jobs of one batch message share
// Seq; each applies after the one before it (no false ErrGap), a job of
// the batch already applied answers from its held outcome, and a first
// job of an applied batch whose outcome is not held is still a gap, and
// so is any job of the batch before the one applied last (the entry keeps
// the batch index).
func TestStateAppliesJobsOfOneBatchInOrder(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	s := NewState(e.topo.State)
	inc := func(cur []byte) ([]byte, []byte, error) {
		n := len(cur) + 1
		return []byte(strings.Repeat("x", n)), []byte(itoa(uint64(n))), nil
	}
	job := func(id string, index int) Job {
		j := Job{ID: id, Key: "k", Seq: 5, Fence: 1}
		core.SetIndex(&j, index)
		return j
	}
	for i, id := range []string{"j0", "j1", "j2"} {
		res, err := s.Apply(ctx(t), job(id, i), inc)
		if err != nil || string(res) != itoa(uint64(i+1)) {
			t.Fatalf("job %s of the batch: %q, %v", id, res, err)
		}
	}
	res, err := s.Apply(ctx(t), job("j1", 1), func([]byte) ([]byte, []byte, error) { panic("must not run") })
	if err != nil || string(res) != "2" {
		t.Fatalf("j1 again: %q, %v; want its held outcome", res, err)
	}
	if _, err := s.Apply(ctx(t), job("other", 0), inc); !errors.Is(err, ErrGap) {
		t.Fatalf("an unheld first job of an applied batch: %v, want ErrGap", err)
	}
	// A job of the batch that did not apply (dead-lettered) while a later
	// one of its key did: redelivered, it is a gap, not run after the later
	// one. It ran before the entry kept the batch index.
	if res, err := s.Apply(ctx(t), job("j5", 5), inc); err != nil || string(res) != "4" {
		t.Fatalf("job j5 of the batch: %q, %v", res, err)
	}
	if _, err := s.Apply(ctx(t), job("j4", 4), func([]byte) ([]byte, []byte, error) { panic("must not run") }); !errors.Is(err, ErrGap) {
		t.Fatalf("an unheld job before the batch's last applied one: %v, want ErrGap", err)
	}
	if _, err := s.Apply(ctx(t), job("j6", 6), inc); err != nil {
		t.Fatalf("a job after the batch's last applied one: %v", err)
	}
}

// TestWorkerWithoutOptionsRunsBatches: every worker reads batch messages,
// with no option to say so (WorkerConfig.Batches is gone; a worker
// without it dead-lettered a batch whole, as a malformed message). A
// worker given nothing but a plain Handler runs each job of a batch once,
// with its own key and payload, dead-letters nothing, and acks the
// message.
func TestWorkerWithoutOptionsRunsBatches(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var mu sync.Mutex
	ran := map[string]int{}
	e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[j.Key+"="+string(j.Payload)]++
		return nil, nil
	}), nil)
	e.publishBatch(0, "batch-1", []wire.BatchJob{{Key: "seat:a", ID: "a1", Payload: []byte("1")}, {Key: "seat:b", ID: "b1", Payload: []byte("2")}})
	testwait.Eventually(t, 10*time.Second, "the batch run and acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 2 && e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if n := len(e.deadLetters()); n != 0 || ran["seat:a=1"] != 1 || ran["seat:b=2"] != 1 {
		t.Fatalf("ran %v; %d dead letters", ran, n)
	}
}
