package keylane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
)

// TestStalledKeyOfBatchJobsDoesNotHoldTheWindow: three keys of one
// partition fail at once with MaxInFlight 4 (issue 28, bug 5). Key a
// keeps five jobs of a batch message of several (never handed back: a
// message cannot be half-NAKed), keys b and c keep two jobs each: sent
// alone (batches of one, which can be handed back), or, in "several", in
// batch messages of several too, so that nothing in the window can be
// handed back. Every job counts in the window whatever message it came
// in, so the window is full of failing keys' jobs. Another key's call
// must still be answered (promise 8): the worker hands back what came
// alone and, when nothing else can be handed back, lets the next message
// in over the window (lanes.WaitRoom). Every failing key's jobs must run
// once released.
func TestStalledKeyOfBatchJobsDoesNotHoldTheWindow(t *testing.T) {
	t.Run("alone", func(t *testing.T) { stalledKeyOfBatchJobs(t, false) })
	t.Run("several", func(t *testing.T) { stalledKeyOfBatchJobs(t, true) })
}

func stalledKeyOfBatchJobs(t *testing.T, several bool) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var failing atomic.Bool
	failing.Store(true)
	var mu sync.Mutex
	fails := map[string]int{}
	ran := map[string]int{}
	h := HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if job.Key != "other" && failing.Load() {
			fails[job.Key]++
			return nil, fmt.Errorf("%s fails until released", job.Key)
		}
		ran[job.Key]++
		return []byte(strconv.Itoa(ran[job.Key])), nil
	})
	w := e.worker("w", h, func(c *WorkerConfig) {
		c.MaxInFlight, c.MaxPending, c.MaxDeliver, c.Concurrency = 4, 64, 1_000_000, 2
		c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	})
	e.waitOwned(w)
	submit := func(key string) {
		t.Helper()
		if _, err := e.client.Submit(ctx(t), key, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		submit(k) // the heads, each a batch of one
	}
	testwait.Eventually(t, 10*time.Second, "the three heads retrying", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return fails["a"] >= 2 && fails["b"] >= 2 && fails["c"] >= 2
	})
	var jobs []wire.BatchJob
	for range 5 {
		jobs = append(jobs, wire.BatchJob{Key: "a", Payload: []byte("a")})
	}
	e.publishBatch(0, "stalled-a", jobs)
	if several {
		e.publishBatch(0, "stalled-bc", []wire.BatchJob{{Key: "b", Payload: []byte("b")}, {Key: "c", Payload: []byte("c")}})
		e.publishBatch(0, "stalled-cb", []wire.BatchJob{{Key: "c", Payload: []byte("c")}, {Key: "b", Payload: []byte("b")}})
	} else {
		for _, k := range []string{"b", "b", "c", "c"} {
			submit(k)
		}
	}
	cctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	res, err := e.client.Call(cctx, "other", nil)
	cancel()
	if err != nil || string(res) != "1" {
		t.Fatalf("another key's call while three keys fail = %q, %v; stats %+v, tenures %+v", res, err, w.Stats(), w.Tenures())
	}
	mu.Lock()
	settled := ran["a"] + ran["b"] + ran["c"]
	mu.Unlock()
	if s := w.Stats(); s.DeadLettered != 0 || settled != 0 {
		t.Fatalf("a failing key's head settled during the call (dead-lettered %d, ran %d): the call proved nothing", s.DeadLettered, settled)
	}
	failing.Store(false)
	testwait.Eventually(t, 30*time.Second, "every failing key's jobs run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ran["a"] == 6 && ran["b"] == 3 && ran["c"] == 3
	})
	testwait.Eventually(t, 10*time.Second, "every job acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	mu.Lock()
	defer mu.Unlock()
	if ran["a"] != 6 || ran["b"] != 3 || ran["c"] != 3 {
		t.Fatalf("ran %v, want a 6, b 3, c 3 (each job once)", ran)
	}
}
