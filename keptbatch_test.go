package keylane

import (
	"context"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/jsbatch"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// keptWatch records, from a second connection, every put to the results
// bucket's subjects, as the worker published it.
type keptWatch struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func watchKept(e *env) *keptWatch {
	e.t.Helper()
	return watchKeptOn(e.t, natstest.Connect(e.t, e.srv), e.topo.Names.Results())
}

// watchKeptOn records the puts to the results bucket named results seen
// on nc, subscribed (and flushed) before it returns.
func watchKeptOn(t *testing.T, nc *nats.Conn, results string) *keptWatch {
	t.Helper()
	kw := &keptWatch{}
	_, err := nc.Subscribe("$KV."+results+".>", func(m *nats.Msg) {
		kw.mu.Lock()
		kw.msgs = append(kw.msgs, m)
		kw.mu.Unlock()
	})
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		t.Fatal(err)
	}
	return kw
}

// counts returns how many puts were seen, how many carried an atomic batch
// ID, how many were batch commits, and the distinct batch IDs.
func (kw *keptWatch) counts() (puts, batched, commits int, batches map[string]int) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	batches = map[string]int{}
	for _, m := range kw.msgs {
		puts++
		if id := m.Header.Get(jsbatch.IDHeader); id != "" {
			batched++
			batches[id]++
		}
		if m.Header.Get(jsbatch.CommitHeader) != "" {
			commits++
		}
	}
	return puts, batched, commits, batches
}

// waitSeen waits until the watch has seen n puts under IDs starting with
// prefix, counting only puts outside a batch if plain. The server passes
// one publisher's messages on in order, so all the worker published
// before those have been seen too.
func (kw *keptWatch) waitSeen(t *testing.T, prefix string, n int, plain bool) {
	t.Helper()
	testwait.Eventually(t, 10*time.Second, fmt.Sprintf("%d puts of %s… seen", n, prefix), func() bool {
		kw.mu.Lock()
		defer kw.mu.Unlock()
		seen := map[string]bool{}
		for _, m := range kw.msgs {
			id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			if strings.HasPrefix(id, prefix) && (!plain || m.Header.Get(jsbatch.IDHeader) == "") {
				seen[id] = true
			}
		}
		return len(seen) >= n
	})
}

// reset forgets what was seen.
func (kw *keptWatch) reset() {
	kw.mu.Lock()
	kw.msgs = nil
	kw.mu.Unlock()
}

// gate holds a reducer's job with payload "gate" until released.
type gate struct {
	entered chan struct{} // a gate job is reducing
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

// reducer counts like counter, but waits at a gate job.
func (g *gate) reducer() Reducer {
	c := newCounter()
	return ReducerFunc(func(ctx context.Context, j Job, cur []byte) ([]byte, []byte, error) {
		if string(j.Payload) == "gate" {
			select {
			case g.entered <- struct{}{}:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			select {
			case <-g.release:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		return c.Reduce(ctx, j, cur)
	})
}

// gatedCalls makes n concurrent Calls with IDs prefix-0… to key while the
// reducer holds a gate job of that key, so they queue and run grouped
// once the gate opens. Each Call's outcome must be readable by ID in the
// results bucket as soon as the Call returns: kept before the reply.
func gatedCalls(t *testing.T, e *env, g *gate, key, prefix string, n int) {
	t.Helper()
	gateDone := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), key, []byte("gate"), WithID(prefix+"-gate"))
		gateDone <- err
	}()
	select {
	case <-g.entered:
	case <-ctx(t).Done():
		t.Fatal("the gate job never ran")
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("%s-%d", prefix, i)
			if _, err := e.client.Call(ctx(t), key, []byte("inc"), WithID(id)); err != nil {
				errs[i] = err
				return
			}
			if _, err := e.topo.Results.Get(ctx(t), id); err != nil {
				errs[i] = fmt.Errorf("outcome of %s not kept when its Call returned: %w", id, err)
			}
		}()
	}
	// The jobs stream keeps jobs until acked: the gate's and every Call's,
	// in batch messages (a caller's ID too), so its jobs are counted by
	// their batches' counts, not its messages.
	stored := func() int {
		jobs := 0
		for _, m := range natstest.StreamMsgs(t, e.js, e.topo.Names.Jobs()) {
			k, err := strconv.Atoi(m.Header.Get(wire.HeaderBatchJobs))
			if err != nil {
				k = 1 // a one-job message
			}
			jobs += k
		}
		return jobs
	}
	testwait.Eventually(t, 10*time.Second, "every call stored behind the gate", func() bool {
		return stored() == n+1
	})
	g.release <- struct{}{}
	wg.Wait()
	if err := <-gateDone; err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestKeptOutcomesGoAsOneBatchPerGroup: a key's jobs with callers' IDs,
// queued before the worker starts, are group-committed; with OutcomeBatch
// 2 (the default of a replicated namespace) every group's
// outcomes go to the results bucket as one atomic batch (one commit per
// state write), and every outcome is readable by ID. Fails when the
// outcomes go one by one (no put carries a batch ID).
func TestKeptOutcomesGoAsOneBatchPerGroup(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const key, queued = "sku:hot", 60
	reqs := make([]Request, queued)
	for i := range reqs {
		reqs[i] = Request{Key: key, Payload: []byte("inc"), ID: fmt.Sprintf("q-%d", i)}
	}
	e.submitAll(reqs)
	kw := watchKept(e)
	w := e.worker("w1", nil, func(c *WorkerConfig) { c.Handler, c.Reducer, c.OutcomeBatch = nil, newCounter(), 2 })
	waitEmpty(e)
	for _, r := range reqs {
		v, err := e.topo.Results.Get(ctx(t), r.ID)
		if err != nil {
			t.Fatalf("outcome of %s: %v", r.ID, err)
		}
		if res, rerr, ok := decodeResult(v.Value()); !ok || rerr != nil || len(res) == 0 {
			t.Fatalf("outcome of %s = %q", r.ID, v.Value())
		}
	}
	entry, err := e.topo.State.Get(ctx(t), StateKey(key))
	if err != nil {
		t.Fatal(err)
	}
	groups := int(entry.Revision()) // one state write per group
	kw.waitSeen(t, "q-", queued, false)
	puts, batched, commits, batches := kw.counts()
	t.Logf("%d jobs, %d groups, %d puts, %d batches %v", queued, groups, puts, commits, batches)
	// A group of one job goes as a plain put; every other is one batch.
	if puts != queued || batched < queued-(groups-commits) {
		t.Fatalf("%d puts, %d of them in a batch; want %d, all batched but groups of one", puts, batched, queued)
	}
	if commits == 0 || commits != len(batches) || commits > groups || groups == queued {
		t.Fatalf("%d batch commits (%d batch IDs) for %d groups of %d jobs: want one per group", commits, len(batches), groups, queued)
	}
	if n, r := w.kept.Batches(), w.kept.Refused(); n != int64(commits) || r != 0 {
		t.Fatalf("worker counted %d batches, %d refused; want %d, 0", n, r, commits)
	}
}

// TestSetupAllowsAtomicPublishOnResults: a namespace made before kept
// outcomes went in batches has a results stream without
// AllowAtomicPublish; Setup adds it in place, keeping the stored outcomes.
func TestSetupAllowsAtomicPublishOnResults(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	name := "KV_" + e.topo.Names.Results()
	allowed := func() bool {
		t.Helper()
		s, err := e.js.Stream(ctx(t), name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.AllowAtomicPublish
	}
	if !allowed() {
		t.Fatal("a new namespace's results stream does not allow atomic batches")
	}
	setAtomicPublish(t, e, false)
	if _, err := e.topo.Results.Put(ctx(t), "old-job", encodeResult([]byte("kept"), nil, false)); err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), e.js, e.topo.Config)
	if err != nil {
		t.Fatal(err)
	}
	if !allowed() {
		t.Fatal("Setup left the results stream without AllowAtomicPublish")
	}
	if v, err := topo.Results.Get(ctx(t), "old-job"); err != nil || string(v.Value()) != "okept" {
		t.Fatalf("kept outcome after the upgrade: %v", err)
	}
}

// setAtomicPublish sets AllowAtomicPublish on the results stream with a
// real stream update.
func setAtomicPublish(t *testing.T, e *env, on bool) {
	t.Helper()
	s, err := e.js.Stream(ctx(t), "KV_"+e.topo.Names.Results())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.AllowAtomicPublish = on
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
}

// TestKeptOutcomesFallBackWhenBatchesRefused: the results stream loses
// AllowAtomicPublish under a running worker. The next group's batch is
// refused and its outcomes are put one by one at once, each kept before
// its Call returns; the worker remembers the refusal, so the group after
// that sends no batch at all. Fails without the fallback (the Calls wait
// on a batch retried forever) or without the memory (two refusals).
func TestKeptOutcomesFallBackWhenBatchesRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	gate := newGate()
	w := e.worker("w1", nil, func(c *WorkerConfig) { c.Handler, c.Reducer, c.OutcomeBatch = nil, gate.reducer(), 2 })
	e.waitOwned(w)
	kw := watchKept(e)
	gatedCalls(t, e, gate, "sku:a", "before", 20)
	kw.waitSeen(t, "before-", 21, false)
	if _, batched, _, _ := kw.counts(); batched == 0 || w.kept.Batches() == 0 {
		t.Fatal("no batch while the stream allowed them")
	}

	setAtomicPublish(t, e, false)
	kw.reset()
	gatedCalls(t, e, gate, "sku:a", "refused", 20)
	kw.waitSeen(t, "refused-", 21, true)
	puts, _, commits, _ := kw.counts()
	if r := w.kept.Refused(); r != 1 || commits != 1 {
		t.Fatalf("%d refused batches, %d commits seen; want the one refused", r, commits)
	}
	if puts < 21 {
		t.Fatalf("%d puts for 21 calls", puts)
	}

	kw.reset()
	gatedCalls(t, e, gate, "sku:a", "after", 20)
	kw.waitSeen(t, "after-", 21, false)
	if _, batched, _, _ := kw.counts(); batched != 0 || w.kept.Refused() != 1 {
		t.Fatalf("%d batched puts, %d refused after the refusal; want none, 1", batched, w.kept.Refused())
	}
}

// TestRedriveKeepsBothIDsInOneBatch: a redriven job's outcome is kept
// under its own ID and the dead-lettered job's, as one batch of two.
func TestRedriveKeepsBothIDsInOneBatch(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var mu sync.Mutex
	broken := true
	e.worker("w", HandlerFunc(func(context.Context, Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if broken {
			return nil, Permanent(errors.New("down"))
		}
		return []byte("booked"), nil
	}), func(c *WorkerConfig) { c.OutcomeBatch = 2 })
	if _, err := e.client.Call(ctx(t), "seat:1", nil, WithID("order-1")); err == nil {
		t.Fatal("the job succeeded while broken")
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	mu.Lock()
	broken = false
	mu.Unlock()
	kw := watchKept(e)
	id, err := e.client.Redrive(ctx(t), dls[0])
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "both IDs answer with the redriven outcome", func() bool {
		a, err1 := e.client.Result(ctx(t), "order-1")
		b, err2 := e.client.Result(ctx(t), id)
		return err1 == nil && err2 == nil && string(a) == "booked" && string(b) == "booked"
	})
	kw.waitSeen(t, "", 2, false)
	puts, batched, commits, _ := kw.counts()
	if puts != 3 || batched != 2 || commits != 1 { // the operator's redrive ticket, then the worker's batch
		t.Fatalf("%d puts, %d batched, %d commits; want the redrive ticket, then both IDs in one batch", puts, batched, commits)
	}
}

// TestOutcomeBatchDefaults: on one replica the worker keeps outcomes one
// by one unless told otherwise (a batch there costs the server a staging
// store on disk); a replicated namespace batches from two; negative never.
func TestOutcomeBatchDefaults(t *testing.T) {
	for _, tc := range []struct {
		cfg, replicas, want int
	}{
		{0, 1, 0}, {0, 3, 2}, {8, 1, 8}, {1, 1, 2}, {-1, 3, 0},
	} {
		w := &Worker{cfg: WorkerConfig{OutcomeBatch: tc.cfg}, topo: &Topology{Topology: &namespace.Topology{Replicas: tc.replicas}}}
		if got := w.outcomeBatchMin(); got != tc.want {
			t.Errorf("OutcomeBatch %d on R%d: least batch %d, want %d", tc.cfg, tc.replicas, got, tc.want)
		}
	}
	e := newEnv(t, TopologyConfig{Partitions: 1})
	kw := watchKept(e)
	gate := newGate()
	reducerWorker(e, "w1", gate.reducer())
	gatedCalls(t, e, gate, "sku:a", "r1", 10)
	kw.waitSeen(t, "r1-", 11, false)
	if puts, batched, _, _ := kw.counts(); puts != 11 || batched != 0 {
		t.Fatalf("R1 default: %d puts, %d batched; want 11 single puts", puts, batched)
	}
}
