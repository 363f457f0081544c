package inventory

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := map[string]Command{
		"buy 1":      {"buy", 1},
		"set 0":      {"set", 0},
		"restock 25": {"restock", 25},
		"get":        {"get", 0},
		" get ":      {"get", 0},
		"fail":       {"fail", 0},
	}
	for in, want := range good {
		got, err := Parse([]byte(in))
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "buy", "buy 0", "buy -1", "buy x", "set", "get 1", "explode", "buy 1 2", "\xff"} {
		if _, err := Parse([]byte(in)); !errors.Is(err, ErrBadCommand) {
			t.Errorf("Parse(%q) = %v, want ErrBadCommand", in, err)
		}
	}
}

// TestSaleInvariants runs the README's demo path, small: an embedded server,
// three in-process workers, a skewed sale with request-reply and one with
// fire-and-forget submits. Both must sell exactly what the stock allows.
func TestSaleInvariants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	local, err := StartLocal(ctx, LocalConfig{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Stop(context.Background())
	c, err := local.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ff := range []bool{false, true} {
		cfg := SaleConfig{SKUs: 4, Stock: 300, Buyers: 32, Purchases: 2000, FireAndForget: ff}
		v, err := RunSale(ctx, c, cfg, local.Tracker)
		if err != nil {
			t.Fatal(err)
		}
		if !v.OK() {
			t.Fatalf("fire-and-forget=%v: verdict %+v", ff, v)
		}
		var want int64
		for _, d := range v.Demand {
			want += min(d, cfg.Stock)
		}
		if v.Sold != want || v.Sold+v.Refused != int64(cfg.Purchases) {
			t.Fatalf("fire-and-forget=%v: sold %d refused %d, want sold %d of %d", ff, v.Sold, v.Refused, want, cfg.Purchases)
		}
		if v.MaxPerKey != 1 {
			t.Fatalf("max concurrent runs per key %d, want 1", v.MaxPerKey)
		}
	}
}
