package statestore

import (
	"context"
	"testing"
)

// TestStateBatchConflictIsOneKeys: a batch of three writes whose middle
// one is stale is refused whole by the server (atomic: none stored); the
// writes go again alone, so the two good ones are stored with their own
// revisions and only the stale one reports the conflict.
func TestStateBatchConflictIsOneKeys(t *testing.T) {
	e := newEnv(t)
	kv := e.kv
	e.allowAtomicPublish(t) // as a worker with StateBatch does
	s := e.store()
	s.BatchWrites(true, e.nc, testBucket)
	t.Cleanup(func() { s.CloseBatches(context.Background()) })
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
	if !Conflict(out[1].Err) {
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

// TestStateWriteWhenBatchesCloseUnderIt: a write whose partition's
// batcher closed under it (the worker stopping) is sent alone, over the
// revision it was given. Before, the batcher's zero answer replaced that
// revision, and the write went as a create of an existing key: a false
// conflict.
func TestStateWriteWhenBatchesCloseUnderIt(t *testing.T) {
	e := newEnv(t)
	kv := e.kv
	rev, err := kv.Create(ctx(t), "k1", []byte("v0"))
	if err != nil {
		t.Fatal(err)
	}
	s := e.store()
	s.BatchWrites(true, e.nc, testBucket)
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
