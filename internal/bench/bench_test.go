package bench

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseRSS(t *testing.T) {
	rss, err := parseRSS(strings.NewReader("Name:\tx\nVmHWM:\t  900 kB\nVmRSS:\t  512 kB\n"))
	if err != nil || rss != 512<<10 {
		t.Fatalf("rss %d, %v; want %d", rss, err, 512<<10)
	}
}

// memShop keeps stock in memory; its bugs let a test break the invariant.
type memShop struct {
	mu        sync.Mutex
	left      map[string]int64
	loseEvery int  // every n-th sale is reported but not decremented
	oversell  bool // sells below zero
	sales     int
}

func (s *memShop) stock(_ context.Context, skus []string, n int64) error {
	s.left = map[string]int64{}
	for _, k := range skus {
		s.left[k] = n
	}
	return nil
}

func (s *memShop) buy(_ context.Context, sku, _ string) (bool, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left[sku] <= 0 && !s.oversell {
		return false, 0, nil
	}
	s.sales++
	if s.loseEvery > 0 && s.sales%s.loseEvery == 0 {
		return true, 0, nil
	}
	s.left[sku]--
	return true, 0, nil
}

func (s *memShop) levels(_ context.Context, skus []string) ([]int64, error) {
	out := make([]int64, len(skus))
	for i, k := range skus {
		out[i] = s.left[k]
	}
	return out, nil
}

func TestSellChecksInvariant(t *testing.T) {
	w := Workload{Name: "hot", Buyers: 4, SKUs: 3, Skew: 1.1, Purchases: 100, Duration: 10 * time.Second}
	for _, tc := range []struct {
		name  string
		shop  *memShop
		stock int64
		want  string
	}{
		{"correct", &memShop{}, 20, "ok"},
		// With stock to spare, a lost decrement shows as stock left over;
		// once sales pass the stock, as overselling.
		{"lost update", &memShop{loseEvery: 10}, 1000, "LOST 10"},
		{"lost update sold out", &memShop{loseEvery: 10}, 20, "OVERSOLD"},
		{"oversell", &memShop{oversell: true}, 20, "OVERSOLD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := w
			w.Stock = tc.stock
			res, err := sell(context.Background(), w, tc.shop, false, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Check(); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("check %q, want %s", got, tc.want)
			}
			if res.Jobs != w.Purchases {
				t.Fatalf("%d purchases ran, want %d", res.Jobs, w.Purchases)
			}
		})
	}
}
