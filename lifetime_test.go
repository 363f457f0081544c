package keylane

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// TestCloseFailsWaitingCalls: Close ends every Call still waiting with
// ErrClosed at once, instead of leaving it to the caller's deadline (no
// worker runs here, so the job is stored and never answered).
func TestCloseFailsWaitingCalls(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	c := e.client
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.Call(ctx(t), "seat:1", []byte("x"))
			errs <- err
		}()
	}
	// Wait until the three jobs are stored (in one to three batch
	// messages): the Calls then only wait.
	testwait.Eventually(t, 10*time.Second, "three jobs stored", func() bool { return len(storedJobs(t, e.js, e.topo.Names.Jobs())) == 3 })
	closed := time.Now()
	c.Close()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Call after Close: %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a Call still waits %s after Close", time.Since(closed).Round(time.Millisecond))
		}
	}
	if _, err := c.Call(ctx(t), "seat:1", []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Call on a closed client: %v, want ErrClosed", err)
	}
}

// TestWorkerDone: Done is closed once Stop has returned, not before.
func TestWorkerDone(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	w := e.worker("wa", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) { return nil, nil }), nil)
	e.waitOwned(w)
	select {
	case <-w.Done():
		t.Fatal("Done closed while the worker runs")
	default:
	}
	if err := w.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	default:
		t.Fatal("Done not closed after Stop returned")
	}
	idle, err := NewWorker(e.nc, WorkerConfig{ID: "idle", Handler: HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) { return nil, nil })})
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	<-idle.Done()
}

// TestWorkerStateBeforeStart: a Handler gets the worker's State from
// NewWorker on, without a Setup of its own; before Start it says so.
func TestWorkerStateBeforeStart(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	nc := natstest.Connect(t, e.srv)
	var st *State
	h := HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		return st.Apply(ctx, job, func(cur []byte) ([]byte, []byte, error) { return append(cur, 'x'), append(cur, 'x'), nil })
	})
	w, err := NewWorker(nc, WorkerConfig{Topology: e.topo.Config, Handler: h, ID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	st = w.State()
	if _, err := st.Get(ctx(t), "k"); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("State before Start: %v, want ErrNotStarted", err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	for want := range []string{"x", "xx"} {
		res, err := e.client.Call(ctx(t), "k", nil)
		if err != nil || len(res) != want+1 {
			t.Fatalf("call %d: %q, %v", want+1, res, err)
		}
	}
}

// TestOneInfoLinePerPartitionMove: at INFO a worker says once that it
// took a partition and once that it gave it back, not once more for the
// lease under it.
func TestOneInfoLinePerPartitionMove(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	var buf syncBuffer
	w := e.worker("wa", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) { return nil, nil }), func(c *WorkerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	e.waitOwned(w)
	if err := w.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"partition=0", "partition=1"} {
		n := 0
		for _, line := range strings.Split(buf.String(), "\n") {
			if strings.Contains(line, "acquired") && (strings.Contains(line, p) || strings.Contains(line, "lease=p."+p[len("partition="):])) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d INFO lines say %s was acquired, want 1:\n%s", n, p, buf.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
