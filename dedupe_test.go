package keylane

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestSameJobIDAfterDuplicateWindow: the server's duplicate window is cut
// to a second; a job submitted again with the same ID after it is stored
// again, and must still take effect once and answer with the first
// outcome: from the key's held outcomes (Reducer) or the results bucket
// (Handler).
func TestSameJobIDAfterDuplicateWindow(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	e.shortDuplicateWindow()
	var handled atomic.Int64
	h := HandlerFunc(func(_ context.Context, job Job) ([]byte, error) {
		if job.Key == "probe" {
			return nil, nil
		}
		return []byte("handled " + strconv.FormatInt(handled.Add(1), 10)), nil
	})
	for _, tc := range []struct {
		name string
		mod  func(*WorkerConfig)
		key  string
	}{
		{"reducer", func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer }, "r"},
		{"handler", nil, "h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.worker("w-"+tc.name, h, tc.mod)
			e.waitOwned(w)
			defer func() { _ = w.Stop(ctx(t)) }()
			first, err := e.client.Call(ctx(t), tc.key, nil, WithID("pay-"+tc.name))
			if err != nil {
				t.Fatal(err)
			}
			e.duplicateWindowPassed(t, "probe-"+tc.name)
			for range 2 {
				again, err := e.client.Call(ctx(t), tc.key, nil, WithID("pay-"+tc.name))
				if err != nil || string(again) != string(first) {
					t.Fatalf("same ID after the window = %q, %v; want the first outcome %q", again, err, first)
				}
			}
		})
	}
	if n := handled.Load(); n != 1 {
		t.Fatalf("handler ran %d times for one job ID", n)
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "r"); string(got.Value) != "1" {
		t.Fatalf("reducer key value %q, want 1", got.Value)
	}
}

// TestSameJobIDAfterServerRestart: a WorkQueue stream deletes acked jobs,
// so a restarted server rebuilds a duplicate table without them. The same
// job ID submitted again within the two minutes must not apply twice.
func TestSameJobIDAfterServerRestart(t *testing.T) {
	srv := startRestartable(t, "restart")
	wnc, cnc := srv.connect(), srv.connect()
	w, err := NewWorker(wnc, WorkerConfig{Topology: TopologyConfig{Partitions: 1, LeaseTTL: time.Second}, Reducer: countReducer, ID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := NewClient(ctx(t), cnc, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(ctx(t), "k", nil, WithID("X")); err != nil {
		t.Fatal(err)
	}
	state := w.Topology().NewState()
	testwait.Eventually(t, 10*time.Second, "X applied", func() bool {
		got, _ := state.Get(ctx(t), "k")
		return string(got.Value) == "1"
	})
	srv.restart()
	testwait.Eventually(t, 10*time.Second, "client reconnected", cnc.IsConnected)
	if _, err := c.Submit(ctx(t), "k", nil, WithID("X")); err != nil && !isDuplicate(err) {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx(t), "k", nil, WithID("Y")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "Y applied", func() bool {
		got, _ := state.Get(ctx(t), "k")
		return got.JobID == "Y"
	})
	if got, _ := state.Get(ctx(t), "k"); string(got.Value) != "2" {
		t.Fatalf("value %q after X, X again, Y; want 2", got.Value)
	}
}

func isDuplicate(err error) bool { return err != nil && errors.Is(err, ErrDuplicate) }

// shortDuplicateWindow cuts the jobs stream's duplicate window to a
// second.
func (e *env) shortDuplicateWindow() {
	e.t.Helper()
	info, err := e.topo.Jobs.Info(ctx(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	sc := info.Config
	sc.Duplicates = time.Second
	if _, err := e.js.UpdateStream(ctx(e.t), sc); err != nil {
		e.t.Fatal(err)
	}
}

// duplicateWindowPassed publishes a probe (key "probe") with ID id until
// the stream stores it again: the duplicate window has passed for
// anything older. The worker must answer key "probe".
func (e *env) duplicateWindowPassed(t *testing.T, id string) {
	t.Helper()
	if _, err := e.client.Submit(ctx(t), "probe", nil, WithID(id)); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the duplicate window passed", func() bool {
		_, err := e.client.Submit(ctx(t), "probe", nil, WithID(id))
		return err == nil
	})
}
