package keylanepg_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane/internal/redistest"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// TestConnectionCutMidGroup cuts the connection of a group's transaction
// right after one of its statements reached the server (the statement
// ran, its reply is lost): in the middle of the group, nothing is written;
// at COMMIT, the group committed and Apply cannot know it. Either way
// Apply fails, and applying the group again (a redelivery) leaves each job
// applied once: nothing the first time and everything now, or everything
// the first time and answers from the record now.
func TestConnectionCutMidGroup(t *testing.T) {
	s, direct := startShop(t, 4)
	ctx := context.Background()
	for _, tc := range []struct {
		name, marker string
		committed    bool
	}{
		{"MidGroup", "UPDATE stock", false},
		// pgx's COMMIT, a simple query message: 'Q', its length, the text
		// ("commit" alone would match BEGIN's "read committed").
		{"AtCommit", "Q\x00\x00\x00\x0bcommit\x00", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, err := redistest.NewProxy(fmt.Sprintf("127.0.0.1:%d", s.Port))
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", proxy.Addr))
			if err != nil {
				t.Fatal(err)
			}
			db, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			sku := "cut-" + tc.name
			setStock(t, direct, sku, 10)
			g := group(20, 1, buy(sku+"-1", sku), buy(sku+"-2", sku))

			proxy.CutAfter(tc.marker)
			if out, err := keylanepg.Apply(ctx, db, g, shop.Sell); err == nil {
				t.Fatalf("Apply with its connection cut after %q: %+v, want an error", tc.marker, out)
			} else {
				t.Logf("cut after %q: %v", tc.marker, err)
			}
			if proxy.Cuts() != 1 {
				t.Fatalf("%d cuts", proxy.Cuts())
			}
			var want shop.Audit
			if tc.committed {
				want = shop.Audit{Stock: 8, Orders: 2, Units: 2}
			} else {
				want = shop.Audit{Stock: 10}
			}
			if a := audit(t, direct, sku); a != want {
				t.Fatalf("after the cut: %+v, want %+v", a, want)
			}

			out, err := keylanepg.Apply(ctx, db, g, shop.Sell)
			if err != nil {
				t.Fatal(err)
			}
			wantStatus := keylanepg.Applied
			if tc.committed {
				wantStatus = keylanepg.Recorded
			}
			for _, o := range out {
				if o.Status != wantStatus {
					t.Errorf("redelivered %s: %s, want %s", o.JobID, o.Status, wantStatus)
				}
			}
			if a := audit(t, direct, sku); a != (shop.Audit{Stock: 8, Orders: 2, Units: 2}) {
				t.Errorf("after the redelivery: %+v", a)
			}
		})
	}
}
