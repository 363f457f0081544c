package keylanepg_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
)

// BenchmarkPruneBesideApply measures what a prune costs the partitions'
// transactions: keylane_outcomes holds 500,000 day-old outcomes; groups
// of 16 purchases (shop.SellSet) apply one after another, first alone
// for 3 s, then while Prune deletes the old outcomes. It reports each
// phase's group latency (p50, p99, max, in ms) and the prune's duration
// and rows/s. A prune that stalled the transactions would show in the
// second phase's p99 and max.
//
//	cd pg && go test -run '^$' -bench BenchmarkPruneBesideApply -benchtime 1x .
func BenchmarkPruneBesideApply(b *testing.B) {
	const old = 500_000
	_, db := startShop(b, 8)
	setStock(b, db, "hot", 1<<62)
	ctx := context.Background()
	seq := 0
	applyFor := func(until func() bool) (lat []time.Duration) {
		jobs := make([]keylane.Job, 16)
		for !until() {
			for k := range jobs {
				seq++
				jobs[k] = buy(fmt.Sprintf("j%d", seq), "hot")
			}
			start := time.Now()
			if _, err := applyAs(ctx, "set", db, group(0, 1, jobs...)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		return lat
	}
	report := func(phase string, lat []time.Duration) {
		slices.Sort(lat)
		q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1000 }
		b.ReportMetric(q(0.5), phase+"-p50-ms")
		b.ReportMetric(q(0.99), phase+"-p99-ms")
		b.ReportMetric(q(1), phase+"-max-ms")
	}
	for b.Loop() {
		if _, err := db.Exec(ctx, `INSERT INTO keylane_outcomes (namespace, job_id, key, fence, result, at)
			SELECT $1, 'old-' || i, 'hot', 1, 'sold 1', now() - interval '25 hours' FROM generate_series(1, $2::int) AS i`, ns, old); err != nil {
			b.Fatal(err)
		}
		if _, err := db.Exec(ctx, `VACUUM ANALYZE keylane_outcomes`); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		report("alone", applyFor(func() bool { return time.Since(t0) > 3*time.Second }))

		done := make(chan struct{})
		var n int64
		var perr error
		var took time.Duration
		go func() {
			defer close(done)
			start := time.Now()
			n, perr = keylanepg.Prune(ctx, db, ns, time.Now().Add(-24*time.Hour))
			took = time.Since(start)
		}()
		lat := applyFor(func() bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		})
		if perr != nil {
			b.Fatal(perr)
		}
		if n != old {
			b.Fatalf("pruned %d, want %d", n, old)
		}
		report("pruning", lat)
		b.ReportMetric(took.Seconds(), "prune-s")
		b.ReportMetric(float64(n)/took.Seconds(), "pruned/s")
	}
}

// BenchmarkRecordIndexCost is BenchmarkApplyHotSKU's groups of 16 with
// and without Prune's index on keylane_outcomes (namespace, at): what
// the index costs every Apply's record.
//
//	cd pg && go test -run '^$' -bench BenchmarkRecordIndexCost -benchtime 3s -count 3 .
func BenchmarkRecordIndexCost(b *testing.B) {
	for _, kind := range []string{"handler", "set"} {
		for _, index := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/index=%v", kind, index), func(b *testing.B) {
				_, db := startShop(b, 4)
				setStock(b, db, "hot", 1<<62)
				ctx := context.Background()
				if !index {
					if _, err := db.Exec(ctx, `DROP INDEX keylane_outcomes_at`); err != nil {
						b.Fatal(err)
					}
				}
				jobs := make([]keylane.Job, 16)
				seq := 0
				for b.Loop() {
					for k := range jobs {
						seq++
						jobs[k] = buy(fmt.Sprintf("j%d", seq), "hot")
					}
					if _, err := applyAs(ctx, kind, db, group(0, 1, jobs...)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "jobs/s")
			})
		}
	}
}
