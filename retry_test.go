package keylane

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRetriedCallGetsTheOutcome: a Call retried with the same WithID, after
// a success or after a timeout while the job still runs, returns the job's
// outcome (and never runs it twice).
func TestRetriedCallGetsTheOutcome(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	gate := make(chan struct{})
	slow := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		if string(job.Payload) == "slow" {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		return countReducer(ctx, job, cur)
	})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, slow })
	e.waitOwned(w)

	// After a success.
	first, err := e.client.Call(ctx(t), "k", nil, WithID("order-1"))
	if err != nil || string(first) != "1" {
		t.Fatalf("first call = %q, %v", first, err)
	}
	short, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	again, err := e.client.Call(short, "k", nil, WithID("order-1"))
	cancel()
	if err != nil || string(again) != "1" {
		t.Fatalf("retried call after success = %q, %v; want the first outcome", again, err)
	}

	// After a timeout, while the job still runs.
	short, cancel = context.WithTimeout(ctx(t), 300*time.Millisecond)
	_, err = e.client.Call(short, "k", []byte("slow"), WithID("order-2"))
	cancel()
	var nr *NoReplyError
	if !errors.Is(err, ErrNoReply) || !errors.As(err, &nr) || nr.JobID != "order-2" {
		t.Fatalf("timed-out call = %v; want ErrNoReply naming order-2", err)
	}
	done := make(chan error, 1)
	var res []byte
	go func() {
		var err error
		res, err = e.client.Call(ctx(t), "k", []byte("slow"), WithID("order-2"))
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("retried call returned %q, %v before the job finished", res, err)
	case <-time.After(300 * time.Millisecond):
	}
	close(gate)
	select {
	case err := <-done:
		if err != nil || string(res) != "2" {
			t.Fatalf("retried call = %q, %v; want 2", res, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("retried call never got the outcome")
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "k"); string(got.Value) != "2" {
		t.Fatalf("value %q, want 2: a retry ran twice", got.Value)
	}
}

// TestSubmitSaysDuplicate: on a namespace with a key backlog cap, where a
// job goes as a one-job message whose Nats-Msg-Id is its ID, a second
// Submit with the same ID stores nothing and says so. (Elsewhere the copy
// travels in a batch and is de-duplicated by the worker:
// TestRetryByIDInABatchRunsOnce.)
func TestSubmitSaysDuplicate(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: 10})
	if _, err := e.client.Submit(ctx(t), "k", nil, WithID("s-1")); err != nil {
		t.Fatal(err)
	}
	id, err := e.client.Submit(ctx(t), "k", nil, WithID("s-1"))
	if !errors.Is(err, ErrDuplicate) || id != "s-1" {
		t.Fatalf("second submit = %q, %v; want s-1 and ErrDuplicate", id, err)
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 1 {
		t.Fatalf("%d jobs stored, want 1", n)
	}
}
