package keylane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
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

// TestRepeatedSubmitOnACappedNamespaceRunsOnce: on a namespace with a key
// backlog cap a job goes alone, as a batch of one on its key's subject
// (where the server counts it against the cap), under a batch ID of its
// own: a second Submit with the same caller's ID is stored too, and the
// worker, which looks a caller's ID up before running it, runs the job
// once. (On main before the one path, a one-job message under its ID,
// de-duplicated by the server and answered ErrDuplicate.)
func TestRepeatedSubmitOnACappedNamespaceRunsOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: 10})
	for range 2 {
		if id, err := e.client.Submit(ctx(t), "k", []byte("x"), WithID("s-1")); err != nil || id != "s-1" {
			t.Fatalf("submit = %q, %v; want s-1 stored", id, err)
		}
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 2 {
		t.Fatalf("%d messages stored, want 2 (both copies, for the worker to de-duplicate)", n)
	}
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := s.GetMsg(ctx(t), seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(wire.HeaderBatch) != "1" || m.Header.Get(wire.HeaderBatchJobs) != "1" || m.Subject != partition.Subject(e.ns, 0, "k") {
			t.Fatalf("stored message %d on %s with headers %v: want a batch of one on the key's subject", seq, m.Subject, m.Header)
		}
		if m.Header.Get(HeaderJobID) == "s-1" {
			t.Fatalf("stored message %d under the caller's ID: a batch's ID is its own", seq)
		}
	}
	var runs atomic.Int32
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		runs.Add(1)
		return []byte("ok"), nil
	}), nil)
	testwait.Eventually(t, 20*time.Second, "both copies acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	if n := runs.Load(); n != 1 {
		t.Fatalf("job s-1 ran %d times, want once", n)
	}
}
