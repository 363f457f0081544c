package keylane

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestStopDeadlineCancelsTheDrain: Stop drains gracefully, but when its
// context ends it aborts: the running handler's context is cancelled, the
// jobs still queued behind it do not run, nothing more is acked, and Stop
// returns. Before, an abort that came while the owner was already draining
// (its queued jobs running one by one) cancelled nothing: a Stop with a
// 300ms deadline waited for every queued job. The jobs travel in batch
// messages, acked once every job of them settled: every job that did not
// run is still stored, and a next owner runs it.
func TestStopDeadlineCancelsTheDrain(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const jobs, hold = 40, 200 * time.Millisecond
	var ran, cancelled atomic.Int32
	var mu sync.Mutex
	done := map[string]bool{} // the IDs of the jobs that ran to the end
	started := make(chan struct{}, jobs)
	w := e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		started <- struct{}{}
		t := time.NewTimer(hold)
		defer t.Stop()
		select {
		case <-t.C:
			mu.Lock()
			done[j.ID] = true
			mu.Unlock()
			ran.Add(1)
			return nil, nil
		case <-ctx.Done():
			cancelled.Add(1)
			return nil, ctx.Err()
		}
	}), nil)
	e.waitOwned(w)
	reqs := make([]Request, jobs)
	for i := range reqs {
		reqs[i] = Request{Key: "one-key", Payload: []byte("x"), ID: fmt.Sprintf("j-%d", i)}
	}
	if _, err := e.client.SubmitMany(ctx(t), reqs); err != nil {
		t.Fatal(err)
	}
	<-started // the first job runs; the others queue behind it on the key
	// Wait until they are fetched: a Stop before that has nothing queued
	// to drain, finishes with the running job, and proves nothing.
	testwait.Eventually(t, 10*time.Second, "the key's jobs fetched", func() bool {
		ts := w.Tenures()
		return len(ts) == 1 && ts[0].InFlight >= jobs-int(ran.Load())
	})
	sctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_ = w.Stop(sctx)
	took := time.Since(begin)
	if took > 3*time.Second {
		t.Fatalf("Stop with a 300ms deadline took %s (%d jobs ran meanwhile); want it to abort the drain", took.Round(time.Millisecond), ran.Load())
	}
	if cancelled.Load() == 0 && int(ran.Load()) < jobs {
		t.Errorf("no running handler saw its context cancelled")
	}
	// What did not run stays stored for the next owner: each such job is
	// in the stream (a batch message is not acked while a job of it has
	// not settled), and a next owner runs it.
	stored := map[string]bool{}
	for _, j := range storedJobs(t, e.js, e.topo.Names.Jobs()) {
		stored[j.ID] = true
	}
	mu.Lock()
	var unrun []string
	for i := range jobs {
		if id := fmt.Sprintf("j-%d", i); !done[id] {
			unrun = append(unrun, id)
			if !stored[id] {
				t.Errorf("job %s did not run and is no longer stored", id)
			}
		}
	}
	mu.Unlock()
	next := map[string]bool{}
	e.worker("next", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		next[j.ID] = true
		return nil, nil
	}), nil)
	testwait.Eventually(t, 20*time.Second, "the next owner runs the unrun jobs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range unrun {
			if !next[id] {
				return false
			}
		}
		return true
	})
	t.Logf("Stop took %s; %d jobs ran, %d handlers cancelled", took.Round(time.Millisecond), ran.Load(), cancelled.Load())
}
