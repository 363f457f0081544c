package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
)

// TestKilledDatabaseLeavesOutcomesMatchingRows has 8 owners sell 4 SKUs
// while the PostgreSQL server is SIGKILLed (postmaster and backends) and
// restarted, twice. An owner whose Apply fails applies the same group
// again, as a redelivery would, until it is answered. After the run every
// recorded outcome matches the rows: nothing applied without its outcome,
// nothing recorded without its rows, stock = start - sold, no job applied
// twice, and every answer, first or from the record, the same. Run for
// every kind of handler (applyAs).
func TestKilledDatabaseLeavesOutcomesMatchingRows(t *testing.T) {
	forKinds(t, testKilledDatabaseLeavesOutcomesMatchingRows)
}

func testKilledDatabaseLeavesOutcomesMatchingRows(t *testing.T, kind string) {
	s, db := startShop(t, 16)
	const start = 60
	skus := []string{"k0", "k1", "k2", "k3"}
	for _, sku := range skus {
		setStock(t, db, sku, start)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hist := newHistory()
	var (
		wg       sync.WaitGroup
		progress atomic.Int64 // groups answered
		failures atomic.Int64 // Apply calls that failed
		mu       sync.Mutex
		errs     []error
		all      []string
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 12 {
				var jobs []keylane.Job
				for k := range 1 + (i+round)%4 {
					jobs = append(jobs, buy(fmt.Sprintf("o%d-r%d-%d", i, round, k), skus[i%4]))
				}
				mu.Lock()
				for _, j := range jobs {
					all = append(all, j.ID)
				}
				mu.Unlock()
				for {
					out, err := applyAs(ctx, kind, db, group(i, 1, jobs...))
					if err == nil {
						hist.add(out)
						progress.Add(1)
						break
					}
					failures.Add(1)
					if ctx.Err() != nil || errors.Is(err, keylane.ErrStaleFence) {
						mu.Lock()
						errs = append(errs, fmt.Errorf("owner %d round %d: %w", i, round, err))
						mu.Unlock()
						return
					}
					// The database is down or recovering: the group comes
					// again, as a redelivery, after a pause.
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	for kill := range 2 {
		at := int64(20 + 30*kill)
		testwait.Eventually(t, 2*time.Minute, fmt.Sprintf("%d groups answered before kill %d", at, kill+1), func() bool {
			return progress.Load() >= at
		})
		s.Kill()
		if err := s.Restart(); err != nil {
			t.Fatalf("restart after kill %d: %v", kill+1, err)
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	t.Logf("%d groups answered, %d Apply calls failed across 2 kills", progress.Load(), failures.Load())
	if failures.Load() == 0 {
		t.Error("no Apply call failed: the kills hit nothing")
	}
	for _, sku := range skus {
		hist.check(t, db, sku, start, all)
	}
}
