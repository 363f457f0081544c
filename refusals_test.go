package keylane

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestStaleClientSubmitToAGonePartition: after a repartition from 4 to 2
// partitions, a client opened before it routes a key to partition 3,
// whose subject no stream has any more. Submit, Call and SubmitMany end
// at once with ErrPartitionMismatch (on main Submit retried "no response
// from stream" until its context ended).
func TestStaleClientSubmitToAGonePartition(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	if err := Repartition(ctx(t), e.js, e.ns, 2, nil); err != nil {
		t.Fatal(err)
	}
	key := keyIn(3, 4, "gone")
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.client.Submit(c, key, nil); !errors.Is(err, ErrPartitionMismatch) || c.Err() != nil {
		t.Fatalf("stale client's Submit to a gone partition: %v; want ErrPartitionMismatch", err)
	}
	if _, err := e.client.Call(c, key, nil); !errors.Is(err, ErrPartitionMismatch) || c.Err() != nil {
		t.Fatalf("stale client's Call to a gone partition: %v; want ErrPartitionMismatch", err)
	}
	out, err := e.client.SubmitMany(c, []Request{{Key: key}})
	if err != nil || !errors.Is(out[0].Err, ErrPartitionMismatch) {
		t.Fatalf("stale client's SubmitMany to a gone partition: %v, %v; want ErrPartitionMismatch", out[0].Err, err)
	}
}

// TestCallOnARecreatedStreamSaysHeld: the jobs stream was deleted and
// created again, so the key's state carries another epoch and the owner
// holds the Call's job (ErrEpoch) until an operator adopts the old epoch.
// The caller is told at once, with an error that says so (ErrHeld and
// ErrEpoch; the job is stored, call again with its ID), not left to wait
// out its deadline (on main: a NoReplyError after the 20s context). Once
// adopted, the same Call by ID gets the held job's outcome: it ran once.
func TestCallOnARecreatedStreamSaysHeld(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	red := func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer }
	w1 := e.worker("w1", nil, red)
	e.waitOwned(w1)
	if _, err := e.client.Call(ctx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
	if err := w1.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	old := e.topo.Meta.Epoch
	if err := e.js.DeleteStream(ctx(t), e.topo.Names.Jobs()); err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(ctx(t), e.js, e.topo.Config); err != nil {
		t.Fatal(err)
	}
	e.waitOwned(e.worker("w2", nil, red))
	client, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, cancel := context.WithTimeout(ctx(t), 20*time.Second)
	defer cancel()
	_, err = client.Call(c, "k", nil, WithID("held-1"))
	var held *HeldError
	if c.Err() != nil || !errors.Is(err, ErrHeld) || !errors.Is(err, ErrEpoch) || !errors.As(err, &held) || held.JobID != "held-1" {
		t.Fatalf("call on a re-created stream: %v; want a HeldError for held-1 (ErrEpoch) before the deadline", err)
	}
	if err := AdoptEpoch(ctx(t), e.js, e.ns, old); err != nil {
		t.Fatal(err)
	}
	if res, err := client.Call(ctx(t), "k", nil, WithID("held-1")); err != nil || string(res) != "2" {
		t.Fatalf("the held call by ID after adopt: %q, %v; want 2 (1 before, the held one once)", res, err)
	}
}
