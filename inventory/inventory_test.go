package inventory

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane"
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
	for _, in := range []string{"", "buy", "buy 0", "buy -1", "buy x", "set", "get 1", "explode", "buy 1 2", "\xff",
		"set -1", "restock -1", "set 9223372036854775808", "restock 99999999999999999999", "buy 9223372036854775808", "restock 1e3"} {
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

// TestRestockOverflow: a restock that would take the stock past the largest
// int64 wrapped it around to a negative stock. It must be refused, for good,
// and leave the stock as it was.
func TestRestockOverflow(t *testing.T) {
	h := &Handler{}
	for _, tc := range []struct {
		name    string
		stock   int64
		restock int64
		ok      bool
	}{
		{"one past the largest stock", math.MaxInt64 - 5, 6, false},
		{"largest amount onto any stock", 1, math.MaxInt64, false},
		{"exactly to the largest stock", math.MaxInt64 - 5, 5, true},
		{"largest amount onto none", 0, math.MaxInt64, true},
		// A stock that an earlier overflow left negative can be restocked.
		{"largest amount onto a negative stock", -10, math.MaxInt64, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := encode(tc.stock)
			job := keylane.Job{Key: "sku:1", Payload: []byte("restock " + strconv.FormatInt(tc.restock, 10))}
			next, out, err := h.Reduce(t.Context(), job, cur)
			if tc.ok {
				if err != nil || decode(next) != tc.stock+tc.restock {
					t.Fatalf("restock %d onto %d = %q, %q, %v; want stock %d", tc.restock, tc.stock, next, out, err, tc.stock+tc.restock)
				}
				return
			}
			if err == nil {
				t.Fatalf("restock %d onto %d accepted: stock %s, result %q", tc.restock, tc.stock, next, out)
			}
			if !errors.Is(err, ErrOverflow) || !errors.Is(err, keylane.ErrPermanent) {
				t.Fatalf("restock %d onto %d: %v; want a permanent ErrOverflow", tc.restock, tc.stock, err)
			}
			if next != nil {
				t.Fatalf("refused restock returned new stock %q", next)
			}
		})
	}
}

// TestRestockOverflowChangesNothing sends the overflowing restock through
// real workers, both ways the handler runs: the caller gets a permanent
// error and the stored stock is unchanged.
func TestRestockOverflowChangesNothing(t *testing.T) {
	for _, perJob := range []bool{false, true} {
		t.Run(map[bool]string{false: "reducer", true: "handler"}[perJob], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			local, err := StartLocal(ctx, LocalConfig{Workers: 1, PerJobWrites: perJob})
			if err != nil {
				t.Fatal(err)
			}
			defer local.Stop(context.Background())
			c, err := local.Client(ctx)
			if err != nil {
				t.Fatal(err)
			}
			const stock = math.MaxInt64 - 5
			if _, err := c.Call(ctx, "sku:big", []byte("set "+strconv.FormatInt(stock, 10))); err != nil {
				t.Fatal(err)
			}
			res, err := c.Call(ctx, "sku:big", []byte("restock 10"))
			var re *keylane.RemoteError
			if !errors.As(err, &re) || !re.Permanent {
				t.Fatalf("restock 10 onto %d = %q, %v; want a permanent remote error", stock, res, err)
			}
			t.Logf("refused: %v", err)
			res, err = c.Call(ctx, "sku:big", []byte("get"))
			if want := "stock " + strconv.FormatInt(stock, 10); err != nil || string(res) != want {
				t.Fatalf("get after the refused restock = %q, %v; want %q", res, err, want)
			}
		})
	}
}
