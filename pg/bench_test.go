package keylanepg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// BenchmarkApplyHotSKU applies groups of n purchases of one hot SKU, one
// group after another, as the one owner of its partition does: a
// transaction per group, each job its savepoint, conditional UPDATE and
// order INSERT, and its outcome recorded. jobs/s is the figure to set
// beside PostgreSQL alone (one transaction per purchase, 64 clients
// waiting on the row lock). The server is the harness's: fsync on,
// synchronous_commit on.
//
//	cd pg && go test -run '^$' -bench BenchmarkApplyHotSKU -benchtime 3s .
func BenchmarkApplyHotSKU(b *testing.B) {
	for _, kind := range applyKinds {
		for _, n := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("%s/group=%d", kind, n), func(b *testing.B) {
				_, db := startShop(b, 4)
				setStock(b, db, "hot", 1<<62)
				ctx := context.Background()
				jobs := make([]keylane.Job, n)
				seq := 0
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					for k := range jobs {
						seq++
						jobs[k] = buy(fmt.Sprintf("j%d", seq), "hot")
					}
					out, err := applyAs(ctx, kind, db, group(0, 1, jobs...))
					if err != nil {
						b.Fatal(err)
					}
					if out[n-1].Status != keylanepg.Applied {
						b.Fatalf("last job: %+v", out[n-1])
					}
				}
				b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "jobs/s")
			})
		}
	}
}

// BenchmarkApplyManySKUs applies groups of n purchases of n different
// SKUs out of 10,000: one transaction carries the ready jobs of many keys
// of a partition, the case where a key's own group is one job.
//
//	cd pg && go test -run '^$' -bench 'BenchmarkApplyManySKUs' -benchtime 3s .
func BenchmarkApplyManySKUs(b *testing.B) {
	for _, kind := range applyKinds {
		for _, n := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("%s/group=%d", kind, n), func(b *testing.B) {
				_, db := startShop(b, 4)
				ctx := context.Background()
				if _, err := db.Exec(ctx, `INSERT INTO stock SELECT 'sku' || i, 1000000000 FROM generate_series(0, 9999) AS i`); err != nil {
					b.Fatal(err)
				}
				jobs := make([]keylane.Job, n)
				seq := 0
				b.ReportAllocs()
				for b.Loop() {
					for k := range jobs {
						seq++
						jobs[k] = buy(fmt.Sprintf("j%d", seq), fmt.Sprintf("sku%d", (seq*7919)%10000))
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

// BenchmarkPostgresAloneHotSKU is the peer: 64 clients (b.SetParallelism
// over GOMAXPROCS 2) buying the hot SKU straight from PostgreSQL, one
// transaction a purchase, on the same harness as BenchmarkApplyHotSKU:
// the conditional UPDATE alone, and the FOR UPDATE transaction that also
// inserts the order.
//
//	cd pg && go test -run '^$' -bench 'BenchmarkPostgresAloneHotSKU' -benchtime 3s .
func BenchmarkPostgresAloneHotSKU(b *testing.B) {
	for _, mode := range []string{"conditional-update", "for-update-tx"} {
		b.Run(mode, func(b *testing.B) {
			_, db := startShop(b, 70)
			setStock(b, db, "hot", 1<<62)
			ctx := context.Background()
			var seq atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					var err error
					if mode == "conditional-update" {
						_, err = shop.BuyConditional(ctx, db, "hot")
					} else {
						_, err = shop.BuyForUpdate(ctx, db, "hot", fmt.Sprint("p", seq.Add(1)))
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}

// applyKinds are the three ways to apply a group: shop.Sell through Apply
// (a round trip per statement), shop.SellPipeline through ApplyPipeline
// (the group's statements in one), shop.SellSet through ApplySet (the
// group's reads in one round trip, its writes, a few statements for all
// its jobs, in the next).
var applyKinds = []string{"handler", "pipeline", "set"}

func applyAs(ctx context.Context, kind string, db keylanepg.DB, g keylanepg.Group) ([]keylanepg.Outcome, error) {
	switch kind {
	case "pipeline":
		return keylanepg.ApplyPipeline(ctx, db, g, shop.SellPipeline)
	case "set":
		return keylanepg.ApplySet(ctx, db, g, shop.SellSet)
	}
	return keylanepg.Apply(ctx, db, g, shop.Sell)
}
