package keylanepg_test

import (
	"context"
	"fmt"
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
	for _, n := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("group=%d", n), func(b *testing.B) {
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
				out, err := keylanepg.Apply(ctx, db, group(0, 1, jobs...), shop.Sell)
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
