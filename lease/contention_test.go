package lease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/lease"
)

// TestContention has 32 goroutines campaign for one key until each held it
// a few times, and checks that no two ever held it at once and that every
// tenure's fence is above the one before.
func TestContention(t *testing.T) {
	const (
		workers = 32
		wins    = 3
	)
	e := newEnv(t, 2*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	var (
		holders   atomic.Int32
		maxSeen   atomic.Int32
		mu        sync.Mutex
		lastFence uint64
		tenures   int
		counts    [workers]int
		wg        sync.WaitGroup
	)
	start := time.Now()
	for i := range workers {
		wg.Go(func() {
			cfg := config(t, fmt.Sprintf("worker-%02d", i))
			for counts[i] < wins {
				l, err := lease.Campaign(ctx, e.kv, "p.0", cfg)
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
					return
				}
				n := holders.Add(1)
				if n > maxSeen.Load() {
					maxSeen.Store(n)
				}
				if n > 1 {
					t.Errorf("worker %d: %d holders at once", i, n)
				}
				if !l.Trusted() {
					t.Errorf("worker %d: fresh lease not trusted: %v", i, l.Err())
				}
				mu.Lock()
				if l.Fence() <= lastFence {
					t.Errorf("worker %d: fence %d not above the previous %d", i, l.Fence(), lastFence)
				}
				lastFence = l.Fence()
				tenures++
				mu.Unlock()
				time.Sleep(time.Millisecond) // hold it briefly, as a job would
				holders.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("worker %d: release: %v", i, err)
					return
				}
				counts[i]++
			}
		})
	}
	wg.Wait()
	for i, n := range counts {
		if n < wins {
			t.Errorf("worker %d held the key %d times, want %d", i, n, wins)
		}
	}
	t.Logf("%d tenures by %d workers in %s, at most %d holder(s) at once, last fence %d",
		tenures, workers, time.Since(start).Round(time.Millisecond), maxSeen.Load(), lastFence)
}
