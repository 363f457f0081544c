package keylane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/inventory"
)

// BenchmarkFlashSale runs the hot-key flash sale (one SKU) through an
// embedded NATS server and three in-process workers: request-reply at 8, 64
// and 256 buyers, and fire-and-forget bulk submits. It reports jobs/s and
// latency percentiles; every run also checks the sale's invariants.
//
//	go test -run '^$' -bench FlashSale -benchtime 20000x .
func BenchmarkFlashSale(b *testing.B) {
	ctx := context.Background()
	local, err := inventory.StartLocal(ctx, inventory.LocalConfig{Workers: 3})
	if err != nil {
		b.Fatal(err)
	}
	defer local.Stop(ctx)
	c, err := local.Client(ctx)
	if err != nil {
		b.Fatal(err)
	}
	tracker := local.Tracker
	run := func(b *testing.B, cfg inventory.SaleConfig) {
		b.ReportAllocs()
		cfg.SKUs, cfg.Purchases, cfg.Stock = 1, b.N, int64(b.N)/2+1
		cfg.Timeout = 10 * time.Minute
		b.ResetTimer()
		v, err := inventory.RunSale(ctx, c, cfg, tracker)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if !v.OK() {
			b.Fatalf("invariants broken: oversold %d, mismatches %d, failed %d (%s), max per key %d",
				v.Oversold, v.Mismatch, v.Failed, v.FirstError, v.MaxPerKey)
		}
		b.ReportMetric(v.JobsPerS, "jobs/s")
		if !cfg.FireAndForget {
			b.ReportMetric(float64(v.P50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(v.P99.Microseconds())/1000, "p99-ms")
		}
	}
	for _, buyers := range []int{8, 64, 256} {
		b.Run(fmt.Sprintf("call/buyers=%d", buyers), func(b *testing.B) {
			run(b, inventory.SaleConfig{Buyers: buyers})
		})
	}
	b.Run("submit-many", func(b *testing.B) {
		run(b, inventory.SaleConfig{Buyers: 64, FireAndForget: true})
	})
	// Durable: the server fsyncs every write before acking it.
	durable, err := inventory.StartLocal(ctx, inventory.LocalConfig{Workers: 3, SyncAlways: true})
	if err != nil {
		b.Fatal(err)
	}
	defer durable.Stop(ctx)
	if c, err = durable.Client(ctx); err != nil {
		b.Fatal(err)
	}
	tracker = durable.Tracker
	b.Run("durable-call/buyers=64", func(b *testing.B) {
		run(b, inventory.SaleConfig{Buyers: 64})
	})
}
