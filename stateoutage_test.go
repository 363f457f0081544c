package keylane

import (
	"context"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestStateOutageIsNotTheJobsFault: while the state bucket refuses writes
// (here: its stream is full, as a store at its limit or a bucket without a
// leader refuses them), a job is not at fault. It must not spend its
// attempts and be dead-lettered, which would tell a buyer "failed" for a
// purchase whose write may have landed; it waits, with backoff, while the
// lease is trusted, and runs once the bucket takes writes again.
func TestStateOutageIsNotTheJobsFault(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	c := newCounter()
	w := reducerWorker(e, "w", c)
	if _, err := e.client.Call(ctx(t), "sku", []byte("inc"), WithID("first")); err != nil {
		t.Fatal(err)
	}
	s, err := e.js.Stream(ctx(t), "KV_"+e.topo.Names.State())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	full, healthy := info.Config, info.Config
	full.MaxBytes = int64(info.State.Bytes) // the next entry does not fit
	if _, err := e.js.UpdateStream(ctx(t), full); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := e.client.Call(cctx, "sku", []byte("inc"), WithID("during"))
		done <- result{res, err}
	}()
	// Well past MaxDeliver attempts (the test's backoff is 10ms), the job
	// still waits.
	runs := w.Stats().Runs
	testwait.Eventually(t, 20*time.Second, "the worker tries the job twice MaxDeliver times", func() bool {
		select {
		case r := <-done:
			t.Fatalf("Call settled while the state bucket refused writes: %q, %v", r.res, r.err)
		default:
		}
		return w.Stats().Runs >= runs+2*DefaultMaxDeliver
	})
	if _, err := e.js.UpdateStream(ctx(t), healthy); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || string(r.res) != "n=2" {
		t.Fatalf("Call after the outage: %q, %v; want n=2", r.res, r.err)
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters; want none", len(dl))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.applied["during"] != 1 {
		t.Fatalf("job applied %d times; want 1", c.applied["during"])
	}
}
