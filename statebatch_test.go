package keylane

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// stateKeysInBatch submits rounds jobs to each of keys keys of one
// partition, all queued before the worker starts, so that many keys'
// groups finish at once.
func stateKeysInBatch(t *testing.T, cl *Client, prefix string, keys, rounds int) []Request {
	t.Helper()
	var reqs []Request
	for r := range rounds {
		for k := range keys {
			reqs = append(reqs, Request{Key: fmt.Sprintf("%s%d", prefix, k), Payload: []byte("inc"), ID: fmt.Sprintf("%s%d-%d", prefix, k, r)})
		}
	}
	out, err := cl.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	return reqs
}

// checkStateCounts checks that each key holds rounds, its counter's
// value, and that the worker's cached revision of it is the stored one
// (a batch's revisions are computed from its ack: a wrong one would make
// the key's next write conflict).
func checkStateCounts(t *testing.T, w *Worker, kv jetstream.KeyValue, prefix string, keys, rounds int) {
	t.Helper()
	cached := 0
	defer func() { t.Logf("%d of %d keys cached", cached, keys) }()
	for k := range keys {
		key := fmt.Sprintf("%s%d", prefix, k)
		sk := StateKey(key)
		e, err := kv.Get(ctx(t), sk)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		st, err := decodeState(e.Value())
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(string(st.Value)); n != rounds {
			t.Fatalf("%s = %q, want %d", key, st.Value, rounds)
		}
		w.state.mu.Lock()
		c, ok := w.state.cache[sk]
		w.state.mu.Unlock()
		if ok {
			cached++
		}
		if ok && c.rev != e.Revision() {
			t.Fatalf("%s: cached revision %d, stored %d", key, c.rev, e.Revision())
		}
	}
}

// TestStateWritesOfSeveralKeysGoAsOneBatch: with StateBatch on, the
// groups of many keys of one partition that finish together store their
// entries in atomic batches (batch headers on the state bucket's
// subjects), every job is applied once, and every cached revision is the
// stored one. Without the coalescing every write goes alone and no batch
// is seen.
func TestStateWritesOfSeveralKeysGoAsOneBatch(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const keys, rounds = 200, 3
	reqs := stateKeysInBatch(t, e.client, "sb", keys, rounds)
	kw := watchKeptOn(t, natstest.Connect(t, e.srv), e.topo.Names.State())
	c := newCounter()
	w := e.worker("w1", nil, func(cfg *WorkerConfig) { cfg.Handler, cfg.Reducer, cfg.StateBatch = nil, c, 1 })
	testwait.Eventually(t, 30*time.Second, "every job acked", func() bool { return w.Stats().Succeeded >= int64(len(reqs)) })
	c.mu.Lock()
	for _, r := range reqs {
		if c.applied[r.ID] != 1 {
			t.Fatalf("%s applied %d times", r.ID, c.applied[r.ID])
		}
	}
	c.mu.Unlock()
	kv, err := e.js.KeyValue(ctx(t), e.topo.Names.State())
	if err != nil {
		t.Fatal(err)
	}
	checkStateCounts(t, w, kv, "sb", keys, rounds)
	_, batched, commits, _ := kw.counts()
	sb := w.state.batched
	t.Logf("%d writes in batches, %d commits; %d batches stored, %d refused", batched, commits, sb.sent.Load(), sb.refused.Load())
	if commits == 0 || sb.sent.Load() == 0 {
		t.Fatalf("no state write went in a batch (%d commits seen)", commits)
	}
	if sb.refused.Load() != 0 {
		t.Fatalf("%d batches refused on a quiet namespace", sb.refused.Load())
	}
}

// TestStateBatchConflictIsOneKeys: a batch of three writes whose middle
// one is stale is refused whole by the server (atomic: none stored); the
// writes go again alone, so the two good ones are stored with their own
// revisions and only the stale one reports the conflict.
func TestStateBatchConflictIsOneKeys(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	kv, err := e.js.KeyValue(ctx(t), e.topo.Names.State())
	if err != nil {
		t.Fatal(err)
	}
	if err := allowAtomicPublish(ctx(t), e.js, "KV_"+e.topo.Names.State()); err != nil { // as a worker with StateBatch does
		t.Fatal(err)
	}
	s := e.topo.NewState()
	s.batchWrites(true, e.nc, e.topo.Names.State())
	t.Cleanup(func() { s.closeBatches(context.Background()) })
	stale, err := kv.Create(ctx(t), "k2", []byte("v0"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx(t), "k2", []byte("v1"), stale); err != nil {
		t.Fatal(err)
	}
	ws := []stateWrite{{k: "k1", value: []byte("a")}, {k: "k2", rev: stale, value: []byte("b")}, {k: "k3", value: []byte("c")}}
	out := s.sendWrites(ctx(t), s.batched, ws)
	for _, i := range []int{0, 2} {
		if out[i].Err != nil {
			t.Fatalf("write %s: %v", ws[i].k, out[i].Err)
		}
		got, err := kv.Get(ctx(t), ws[i].k)
		if err != nil || got.Revision() != out[i].Value || string(got.Value()) != string(ws[i].value) {
			t.Fatalf("%s: stored %v (err %v), reported revision %d", ws[i].k, got, err, out[i].Value)
		}
	}
	if !casConflict(out[1].Err) {
		t.Fatalf("stale write: %v, want a conflict", out[1].Err)
	}
	if got, _ := kv.Get(ctx(t), "k2"); string(got.Value()) != "v1" {
		t.Fatalf("k2 = %q after a stale write", got.Value())
	}
	if s.batched.refused.Load() != 1 {
		t.Fatalf("%d batches refused, want 1", s.batched.refused.Load())
	}
	// A batch that is not refused reports each write's revision.
	ws = []stateWrite{{k: "k4", value: []byte("d")}, {k: "k5", value: []byte("e")}}
	out = s.sendWrites(ctx(t), s.batched, ws)
	for i, w := range ws {
		got, err := kv.Get(ctx(t), w.k)
		if out[i].Err != nil || err != nil || got.Revision() != out[i].Value {
			t.Fatalf("%s: %v, stored revision %v, reported %d", w.k, out[i].Err, got, out[i].Value)
		}
	}
	if s.batched.sent.Load() != 1 {
		t.Fatalf("%d batches stored, want 1", s.batched.sent.Load())
	}
}

func TestStateBatchDefaults(t *testing.T) {
	for _, c := range []struct {
		setting, replicas int
		on                bool
	}{{0, 1, false}, {0, 3, false}, {-1, 3, false}, {1, 1, true}, {1, 3, true}} {
		w := &Worker{cfg: WorkerConfig{StateBatch: c.setting}}
		if got := w.stateBatchOn(); got != c.on {
			t.Errorf("StateBatch %d, replicas %d: on = %v, want %v", c.setting, c.replicas, got, c.on)
		}
	}
}

// TestStateWritesBatchedOnACluster: on three nodes with R3, with
// StateBatch on, many keys' groups store their entries in batches and
// every job is applied once. Fails if R3 refuses them.
func TestStateWritesBatchedOnACluster(t *testing.T) {
	r := startR3(t, "stater3")
	cl := r.client
	const keys, rounds = 60, 2
	reqs := stateKeysInBatch(t, cl, "r3k", keys, rounds)
	ctr := newCounter()
	w := r.worker(WorkerConfig{Reducer: ctr, ID: "r3w", StateBatch: 1})
	testwait.Eventually(t, 60*time.Second, "the worker acked every job", func() bool { return w.Stats().Succeeded >= int64(len(reqs)) })
	ctr.mu.Lock()
	for _, r := range reqs {
		if ctr.applied[r.ID] != 1 {
			t.Fatalf("%s applied %d times", r.ID, ctr.applied[r.ID])
		}
	}
	ctr.mu.Unlock()
	sb := w.state.batched
	if sb == nil {
		t.Fatal("R3: state batches off with StateBatch 1")
	}
	t.Logf("R3: %d state batches stored, %d refused", sb.sent.Load(), sb.refused.Load())
	// A refusal for a passing cause (a leader change mid-batch) may
	// happen on a loaded machine; a refusal in kind would leave no batch.
	if sb.sent.Load() == 0 {
		t.Fatalf("R3: no state batch stored (%d refused)", sb.refused.Load())
	}
}

// TestStateWriteWhenBatchesCloseUnderIt: a write whose partition's
// batcher closed under it (the worker stopping) is sent alone, over the
// revision it was given. Before, the batcher's zero answer replaced that
// revision, and the write went as a create of an existing key: a false
// conflict.
func TestStateWriteWhenBatchesCloseUnderIt(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	kv, err := e.js.KeyValue(ctx(t), e.topo.Names.State())
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Create(ctx(t), "k1", []byte("v0"))
	if err != nil {
		t.Fatal(err)
	}
	s := e.topo.NewState()
	s.batchWrites(true, e.nc, e.topo.Names.State())
	if err := s.batched.b.Close(ctx(t)); err != nil { // closed, still in place: as between put's read of it and Do
		t.Fatal(err)
	}
	next, err := s.put(ctx(t), kv, 0, "k1", rev, []byte("v1"))
	if err != nil {
		t.Fatalf("write over revision %d: %v", rev, err)
	}
	if got, err := kv.Get(ctx(t), "k1"); err != nil || got.Revision() != next || string(got.Value()) != "v1" {
		t.Fatalf("stored %v (%v), reported revision %d", got, err, next)
	}
}
