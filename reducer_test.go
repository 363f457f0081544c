package keylane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/wire"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// counter is a Reducer that adds one to its key's count, and records every
// run's outcome as a CommitObserver.
type counter struct {
	mu       sync.Mutex
	applied  map[string]int // job ID -> applied runs
	order    map[string][]uint64
	running  map[string]int
	maxConc  int
	poisoned string // payload that fails permanently
}

func newCounter() *counter {
	return &counter{applied: map[string]int{}, order: map[string][]uint64{}, running: map[string]int{}}
}

func (c *counter) Reduce(_ context.Context, j Job, cur []byte) ([]byte, []byte, error) {
	c.mu.Lock()
	c.running[j.Key]++
	c.maxConc = max(c.maxConc, c.running[j.Key])
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running[j.Key]--
		c.mu.Unlock()
	}()
	if c.poisoned != "" && string(j.Payload) == c.poisoned {
		return nil, nil, Permanent(errors.New("poisoned"))
	}
	n, _ := strconv.Atoi(string(cur))
	n++
	return []byte(strconv.Itoa(n)), []byte("n=" + strconv.Itoa(n)), nil
}

func (c *counter) Committed(j Job, applied bool) {
	if !applied {
		return
	}
	c.mu.Lock()
	c.applied[j.ID]++
	c.order[j.Key] = append(c.order[j.Key], j.Seq)
	c.mu.Unlock()
}

func reducerWorker(e *env, id string, r Reducer) *Worker {
	return e.worker(id, nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
}

// TestReducerGroupCommits queues many jobs of one hot key before a worker
// starts, then checks that the worker applied every job exactly once, in
// stream order, with far fewer state writes than jobs, and that callers
// got the result of their own job.
func TestReducerGroupCommits(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	const key, queued, calls = "sku:hot", 3000, 40
	reqs := make([]Request, queued)
	for i := range reqs {
		reqs[i] = Request{Key: key, Payload: []byte("inc"), ID: fmt.Sprintf("q-%d", i)}
	}
	e.submitAll(reqs)
	c := newCounter()
	w := reducerWorker(e, "w1", c)
	var wg sync.WaitGroup
	results := make([]string, calls)
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.client.Call(ctx(t), key, []byte("inc"), WithID(fmt.Sprintf("c-%d", i)))
			results[i], errs[i] = string(res), err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Each caller saw its own job's count: all distinct, none above the total.
	seen := map[string]bool{}
	for _, r := range results {
		n, err := strconv.Atoi(r[2:])
		if err != nil || n < 1 || n > queued+calls || seen[r] {
			t.Fatalf("call results %v: %q is not a distinct count", results, r)
		}
		seen[r] = true
	}
	waitEmpty(e)
	st := NewState(e.topo.State)
	got, err := st.Get(ctx(t), key)
	if err != nil || string(got.Value) != strconv.Itoa(queued+calls) {
		t.Fatalf("final count %q, %v; want %d", got.Value, err, queued+calls)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.applied) != queued+calls {
		t.Fatalf("%d jobs applied, want %d", len(c.applied), queued+calls)
	}
	for id, n := range c.applied {
		if n != 1 {
			t.Fatalf("job %s applied %d times", id, n)
		}
	}
	if !slices.IsSorted(c.order[key]) {
		t.Fatal("jobs applied out of stream order")
	}
	if c.maxConc != 1 {
		t.Fatalf("max concurrent runs of the key = %d", c.maxConc)
	}
	kve, err := e.topo.State.Get(ctx(t), StateKey(key))
	if err != nil {
		t.Fatal(err)
	}
	// The bucket's revision counts its writes: one per group, not per job.
	// Under a loaded machine groups are cut by their time bound (groupTime)
	// sooner; half as many writes as jobs still takes grouping.
	if writes := kve.Revision(); writes*2 > queued {
		t.Fatalf("%d state writes for %d queued jobs: no group commit", writes, queued)
	}
	t.Logf("%d jobs with %d state writes; stats %+v", queued+calls, kve.Revision(), w.Stats())
}

func waitEmpty(e *env) {
	e.t.Helper()
	testwait.Eventually(e.t, 30*time.Second, "jobs stream empty", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
}

// TestReducerFailureInGroup puts a permanently failing job in the middle of
// a key's queue: it is dead-lettered, the jobs before and after it are
// applied exactly once and in order.
func TestReducerFailureInGroup(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const key = "seat:9"
	var reqs []Request
	for i := range 100 {
		p := "inc"
		if i == 50 {
			p = "poison"
		}
		reqs = append(reqs, Request{Key: key, Payload: []byte(p), ID: fmt.Sprintf("j-%d", i)})
	}
	if _, err := e.client.SubmitMany(ctx(t), reqs); err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	c.poisoned = "poison"
	reducerWorker(e, "w1", c)
	waitEmpty(e)
	got, err := NewState(e.topo.State).Get(ctx(t), key)
	if err != nil || string(got.Value) != "99" {
		t.Fatalf("final count %q, %v; want 99", got.Value, err)
	}
	if dl := e.deadLetters(); len(dl) != 1 || wire.JobIDOfDead(dl[0].Header) != "j-50" {
		t.Fatalf("dead letters: %d, want only j-50", len(dl))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.applied["j-50"] != 0 || len(c.applied) != 99 || !slices.IsSorted(c.order[key]) {
		t.Fatalf("applied %d jobs (poison %d), in order %v", len(c.applied), c.applied["j-50"], slices.IsSorted(c.order[key]))
	}
}

// TestStateGroupSettlesAppliedJobs group-commits three jobs, then offers a
// new owner's State an overlapping group, as after a crash between write
// and ack: the covered jobs are answered from the stored results without
// running, the new one runs. A lower fence is refused.
func TestStateGroupSettlesAppliedJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	inc := func(ran *[]int) func(i int, cur []byte) ([]byte, []byte, error) {
		return func(i int, cur []byte) ([]byte, []byte, error) {
			*ran = append(*ran, i)
			n, _ := strconv.Atoi(string(cur))
			return []byte(strconv.Itoa(n + 1)), []byte("n=" + strconv.Itoa(n+1)), nil
		}
	}
	jobs := func(fence uint64, seqs ...uint64) []Job {
		var js []Job
		for _, s := range seqs {
			js = append(js, Job{ID: fmt.Sprintf("j%d", s), Key: "k", Seq: s, Fence: fence})
		}
		return js
	}
	var ran []int
	out := make([][]byte, 3)
	n, rerr, werr := NewState(e.topo.State).s.Group(ctx(t), jobs(5, 1, 2, 3), out, inc(&ran))
	if n != 3 || rerr != nil || werr != nil || len(ran) != 3 || string(out[2]) != "n=3" {
		t.Fatalf("first group: n=%d %v %v ran %v out %q", n, rerr, werr, ran, out)
	}
	// A plain Apply by a redelivered job of the group gets its own result.
	res, err := NewState(e.topo.State).Apply(ctx(t), jobs(6, 2)[0], func([]byte) ([]byte, []byte, error) {
		return nil, nil, errors.New("must not run")
	})
	if err != nil || string(res) != "n=2" {
		t.Fatalf("Apply of a grouped job = %q, %v", res, err)
	}
	ran = nil
	out = make([][]byte, 3)
	n, rerr, werr = NewState(e.topo.State).s.Group(ctx(t), jobs(6, 2, 3, 4), out, inc(&ran))
	if n != 3 || rerr != nil || werr != nil {
		t.Fatalf("second group: n=%d %v %v", n, rerr, werr)
	}
	if !slices.Equal(ran, []int{2}) || string(out[0]) != "n=2" || string(out[1]) != "n=3" || string(out[2]) != "n=4" {
		t.Fatalf("second group ran %v, results %q; want only the new job run and stored results for the rest", ran, out)
	}
	_, _, werr = NewState(e.topo.State).s.Group(ctx(t), jobs(5, 9), make([][]byte, 1), inc(&ran))
	if !errors.Is(werr, ErrStaleFence) {
		t.Fatalf("group under an older fence: %v, want ErrStaleFence", werr)
	}
	kve, err := e.topo.State.Get(ctx(t), StateKey("k"))
	if err != nil || kve.Operation() != jetstream.KeyValuePut {
		t.Fatal(err)
	}
}
