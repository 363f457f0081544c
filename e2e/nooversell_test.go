package e2e

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestNoOversell runs a flash sale through three worker processes: 20,000
// single-unit purchases of ten SKUs with Zipf-skewed demand, 64 buyers at
// once. Whatever the interleaving, no SKU may sell more than its stock, each
// purchase must take effect exactly once, and the trace of every run must
// show one run per key at a time, in stream order.
func TestNoOversell(t *testing.T) {
	purchases, nSKU, nBuyers := 20000, 10, 64
	if testing.Short() {
		purchases = 4000
	}
	c := startCluster(t, "e2e-nooversell", 3)
	skus := skuNames("sku", nSKU)

	// Every purchase's SKU is decided up front, so demand is known exactly.
	r := rand.New(rand.NewPCG(7, 11))
	zipf := rand.NewZipf(r, 1.1, 1, uint64(nSKU-1))
	picks := make([]int, purchases)
	demand := make([]int64, nSKU)
	for i := range picks {
		picks[i] = int(zipf.Uint64())
		demand[picks[i]]++
	}
	// A stock between the hottest and the coldest demand: the hot SKUs sell
	// out, the cold ones keep some.
	initial := make([]int64, nSKU)
	for i := range initial {
		initial[i] = int64(purchases) * 3 / 40 // 1500 of 20,000
	}
	over, under := 0, 0
	for i := range demand {
		if demand[i] > initial[i] {
			over++
		} else {
			under++
		}
	}
	if over == 0 || under == 0 {
		t.Fatalf("demand %v vs stock %v: want some SKUs to sell out and some not", demand, initial)
	}
	t.Logf("demand per SKU %v, stock %d each: %d SKUs oversubscribed", demand, initial[0], over)
	c.setStock(skus, initial)

	replies := countReplies(t)
	start := time.Now()
	b := c.startBuyers(nBuyers, skus, "nooversell", purchases, func(i int) int { return picks[i] })
	ps := b.wait()
	elapsed := time.Since(start)
	t.Logf("%d purchases in %s (%.0f/s)", len(ps), elapsed.Round(time.Millisecond), float64(len(ps))/elapsed.Seconds())
	if len(ps) != purchases {
		t.Fatalf("%d purchases made, want %d", len(ps), purchases)
	}

	gotDemand, sold := checkPurchases(t, ps, nSKU)
	for i := range demand {
		if gotDemand[i] != demand[i] {
			t.Fatalf("sku %d: %d purchases made, planned %d", i, gotDemand[i], demand[i])
		}
	}
	soldOut := checkStock(t, c, skus, initial, demand, sold)
	if soldOut != over {
		t.Errorf("%d SKUs sold out, want %d", soldOut, over)
	}
	replies.check(t, purchases, 10*time.Second)

	// Stop the workers so their trace files are complete, then check them.
	c.stopGraceful(15 * time.Second)
	rep := checkTrace(t, readTraces(t, c.traceFiles()), ps, traceRules{once: true})
	t.Logf("trace: %d runs of %d jobs, max concurrent runs per key %d", rep.runs, rep.jobs, rep.maxConcurrent)
	if rep.maxConcurrent != 1 {
		t.Errorf("max concurrent runs per key %d, want 1", rep.maxConcurrent)
	}
}
