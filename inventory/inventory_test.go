package inventory

import (
	"errors"
	"math"
	"strconv"
	"testing"

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
