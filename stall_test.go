package keylane

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestFailingKeyDoesNotStallItsPartition: one key's head job fails and
// retries while that key's backlog is larger than the worker's in-flight
// window. Another key of the same partition must keep flowing, and the
// failing key's jobs must still apply in stream order once it recovers.
func TestFailingKeyDoesNotStallItsPartition(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const window, backlog = 64, 400
	var failing atomic.Bool
	failing.Store(true)
	var order []int // the hot key's applied payload numbers, in apply order
	red := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		if job.Key == "hot" {
			n, _ := strconv.Atoi(string(job.Payload))
			if n == 0 && failing.Load() {
				return nil, nil, fmt.Errorf("head of the hot key fails")
			}
			order = append(order, n) // one key runs one job at a time
		}
		return countReducer(ctx, job, cur)
	})
	w := e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer, c.MaxInFlight, c.MaxDeliver = nil, red, window, 1000
		c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	})
	e.waitOwned(w)

	reqs := make([]Request, backlog)
	for i := range reqs {
		reqs[i] = Request{Key: "hot", Payload: []byte(strconv.Itoa(i))}
	}
	e.submitAll(reqs)
	testwait.Eventually(t, 10*time.Second, "the hot key's head retrying", func() bool { return w.Stats().Failed > 3 })
	for i := range 5 {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx(t), 5*time.Second)
		res, err := e.client.Call(cctx, "other", nil)
		cancel()
		if err != nil || string(res) != strconv.Itoa(i+1) {
			t.Fatalf("another key's call %d while the hot key retries = %q, %v after %s; stats %+v", i, res, err, time.Since(start), w.Stats())
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("another key's call took %s while the hot key retries: the partition is stalled", d)
		}
	}
	failing.Store(false)
	testwait.Eventually(t, 30*time.Second, "the hot key's backlog applied", func() bool {
		got, _ := NewState(e.topo.State).Get(ctx(t), "hot")
		return string(got.Value) == strconv.Itoa(backlog)
	})
	if !slices.IsSorted(order) || len(order) != backlog {
		t.Fatalf("hot key applied %d jobs, in order %v", len(order), slices.IsSorted(order))
	}
	t.Logf("stats %+v", w.Stats())
}
