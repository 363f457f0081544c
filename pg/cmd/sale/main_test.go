package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSaleLocalPostgres runs the command against a throwaway postgres:
// a zipf sale over 3 SKUs, checked against the database's rows, with
// each kind of handler: --pipeline (the default, shop.SellPipeline) and
// --pipeline=false (shop.Sell). Fails if a verdict line is missing or
// says FAILED (per-key concurrency, order, oversell, the database's rows
// against the buyers' answers), or if the sale did not use the kind asked.
func TestSaleLocalPostgres(t *testing.T) {
	for _, tc := range []struct {
		name, flag, kind string
	}{
		{"pipeline", "--pipeline", "shop.SellPipeline"},
		{"handler", "--pipeline=false", "shop.Sell,"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			err := run(ctx, []string{"--postgres", "local", tc.flag, "--skus", "3", "--stock", "100", "--purchases", "600", "--buyers", "32", "--workers", "2", "--partitions", "4"}, &out, &errOut)
			t.Log(out.String())
			if err != nil {
				t.Fatalf("sale: %v\n%s", err, errOut.String())
			}
			for _, want := range []string{"verdict: OK", "max concurrent runs per key 1 (must be 1), out-of-order runs 0",
				"stock = start − sold for 3 of 3 SKUs, 0 rows without their outcome", "verdict (database): OK",
				"synchronous_commit=on", "(keylanepg, " + tc.kind} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
		})
	}
}

// TestSaleNeedsPostgres: without --postgres the command says what it needs.
func TestSaleNeedsPostgres(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var out, errOut bytes.Buffer
	err := run(context.Background(), nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--postgres") {
		t.Fatalf("got %v, want an error naming --postgres", err)
	}
}
