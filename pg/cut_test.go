package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/redistest"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
	"github.com/keylane/keylane/pg/shop"
)

// TestConnectionCutMidGroup cuts the connection of a group's transaction
// right after one of its statements reached the server (the statement
// ran, its reply is lost): in the middle of the group (a purchase's
// UPDATE; for a PipelineHandler, the one batch of BEGIN, fence, outcomes
// and every job's statements) or at the outcomes' record (a Handler's),
// nothing is written; at COMMIT (and, for a PipelineHandler on a pool, at
// the record, which goes with COMMIT), the group committed and Apply
// cannot know it.
// Either way Apply fails, and applying the group again (a redelivery)
// leaves each job applied once: nothing the first time and everything
// now, or everything the first time and answers from the record now. Run
// for every kind of handler (applyAs).
func TestConnectionCutMidGroup(t *testing.T) { forKinds(t, testConnectionCutMidGroup) }

func testConnectionCutMidGroup(t *testing.T, kind string) {
	s, direct := startShop(t, 4)
	ctx := context.Background()
	for _, tc := range []struct {
		name, marker string
		committed    bool
	}{
		{"MidGroup", midGroupMarker(kind), false},
		// A Handler's outcomes' record ran, COMMIT was never sent; a
		// pipeline's or a set's went with its COMMIT (recordAndCommit).
		{"AtRecord", "INSERT INTO keylane_outcomes", kind != "handler"},
		{"AtCommit", commitMarker(kind), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, db := cutPool(t, s)
			sku := "cut-" + kind + "-" + tc.name
			setStock(t, direct, sku, 10)
			g := group(20, 1, buy(sku+"-1", sku), buy(sku+"-2", sku))

			proxy.CutAfter(tc.marker)
			if out, err := applyAs(ctx, kind, db, g); err == nil {
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

			out, err := applyAs(ctx, kind, db, g)
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

// TestWorkerConnectionCutAtCommit: a worker sells a SKU through a pool
// whose connections go through a proxy that cuts one right after a COMMIT
// reached the server, and then again mid-group (after an UPDATE): the
// first transaction committed and the worker cannot know it, the second
// did not. The worker must neither reply nor ack either group, try again,
// and have the record answer what committed: every buyer answered as
// recorded, nothing applied twice, stock = start - sold, one order row
// per sale. Fails if a group whose commit's fate is unknown is acked,
// dead-lettered (a buyer gets an error) or applied again. Run for every
// kind of handler (for shop.SellPipeline the UPDATE rides in the fast
// path's one batch: TestPipelineConnectionCut cuts each of its round
// trips; for shop.SellSet the cut mid-group follows its stock read).
func TestWorkerConnectionCutAtCommit(t *testing.T) { forKinds(t, testWorkerConnectionCutAtCommit) }

func testWorkerConnectionCutAtCommit(t *testing.T, kind string) {
	s, direct := startShop(t, 4)
	proxy, db := cutPool(t, s)
	setStock(t, direct, "k", 30)
	ns := natstest.Start(t)
	hist := newHistory()
	var failed atomic.Int64
	app := shopApplier(kind, db, hist)
	app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		if err != nil {
			failed.Add(1)
		}
	}
	w, _ := startWorker(t, ns.ClientURL(), keylane.TopologyConfig{Namespace: "shop", Partitions: 1}, app, "w")
	owned(t, 1, w)
	c := newClient(t, ns.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b := newBuyers()
	b.buy(ctx, c, 1, "warm", []string{"k"}) // the pool's connection is open
	proxy.CutAfter(commitMarker(kind))
	b.buy(ctx, c, 8, "cut1", sale(12, "k"))
	if proxy.Cuts() != 1 {
		t.Fatalf("%d cuts at COMMIT, want 1", proxy.Cuts())
	}
	proxy.CutAfter(midGroupMarker(kind))
	b.buy(ctx, c, 8, "cut2", sale(12, "k"))
	if proxy.Cuts() != 2 {
		t.Fatalf("%d cuts in all, want 2", proxy.Cuts())
	}
	b.check(t, direct, hist, []string{"k"}, 30)
	if failed.Load() < 2 {
		t.Errorf("%d transactions failed, want the 2 cut", failed.Load())
	}
}

// TestPipelineConnectionCut: a worker sells a SKU with shop.SellPipeline
// through a pool whose connections go through a proxy that cuts one right
// after a message reached the server, at each round trip of the fast
// path in turn: the one batch (BEGIN, fence, outcomes look-up and every
// job's statements: they ran, in a transaction the cut rolls back), and
// the outcomes' record with COMMIT, one message (the group committed,
// and the worker cannot know it), cut after either. The worker must
// neither reply nor ack the cut group, try it again, and have the record
// answer what committed: the group cut at COMMIT comes back Recorded (the
// fast path finds it in the record and gives way to the careful one).
// The history check holds: nothing applied twice, every buyer answered as
// recorded, stock = start - sold, one order row per sale. Fails if a cut
// group is acked or dead-lettered (a buyer gets an error), applied twice,
// or committed where it should have been rolled back (an order row or
// outcome no buyer was told). Run for shop.SellSet too, whose first batch
// carries its stock read and whose writes go with the record and COMMIT.
func TestPipelineConnectionCut(t *testing.T) {
	for _, kind := range []string{"pipeline", "set"} {
		t.Run(kind, func(t *testing.T) { testPipelineConnectionCut(t, kind) })
	}
}

func testPipelineConnectionCut(t *testing.T, kind string) {
	s, direct := startShop(t, 4)
	proxy, db := cutPool(t, s)
	setStock(t, direct, "k", 60)
	nsrv := natstest.Start(t)
	hist := newHistory()
	var failed, recorded atomic.Int64
	app := shopApplier(kind, db, hist)
	app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		if err != nil {
			failed.Add(1)
		}
		for _, o := range out {
			if o.Status == keylanepg.Recorded {
				recorded.Add(1)
			}
		}
	}
	w, _ := startWorker(t, nsrv.ClientURL(), keylane.TopologyConfig{Namespace: ns, Partitions: 1}, app, "w")
	owned(t, 1, w)
	c := newClient(t, nsrv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b := newBuyers()
	b.buy(ctx, c, 1, "warm", []string{"k"}) // the pool's connection is open
	for i, cut := range []struct{ name, marker string }{
		// shop.SellPipeline's buy, or shop.SellSet's stock read, in the
		// batch with BEGIN and the fence.
		{"batch", midGroupMarker(kind)},
		// The record and COMMIT go in one message (a set's writes before
		// them): any of its markers cuts after all ran.
		{"record", "INSERT INTO keylane_outcomes"},
		{"commit", commitMarker(kind)},
		// The order row's INSERT: in the pipeline's first batch, in the
		// set's last.
		{"orders", "INSERT INTO orders"},
	} {
		before := failed.Load()
		proxy.CutAfter(cut.marker)
		b.buy(ctx, c, 8, "cut-"+cut.name, sale(12, "k"))
		if proxy.Cuts() != i+1 {
			t.Fatalf("cut at the %s: %d cuts in all, want %d", cut.name, proxy.Cuts(), i+1)
		}
		if failed.Load() == before {
			t.Errorf("cut at the %s: no transaction failed", cut.name)
		}
	}
	b.check(t, direct, hist, []string{"k"}, 60)
	if recorded.Load() == 0 {
		t.Error("no job answered from the record: the group cut at COMMIT was not found committed")
	}
	t.Logf("%d transactions failed, %d jobs answered from the record", failed.Load(), recorded.Load())
}

// commitMarker is what the proxy sees of the COMMIT of a group applied
// by kind through a pool ("commit" alone would match BEGIN's "read
// committed"): a Handler's transaction is a pgx.Tx, whose Commit is a
// simple query message ('Q', its length, the text); a PipelineHandler's
// fast path queues COMMIT behind the record (recordAndCommit), an
// unnamed statement's Parse: its empty name, then the text.
func commitMarker(kind string) string {
	if kind != "handler" {
		return "\x00commit\x00"
	}
	return "Q\x00\x00\x00\x0bcommit\x00"
}

// midGroupMarker is a statement sent before the group's COMMIT and after
// its BEGIN, in a message of its own: a buy's conditional UPDATE, or a
// set's read of the stock rows (its writes go with the COMMIT).
func midGroupMarker(kind string) string {
	if kind == "set" {
		return "FOR UPDATE"
	}
	return "UPDATE stock"
}

// cutPool connects a pool to s through a fault proxy, both closed when
// the test ends. Every statement's text goes with its execution (no
// prepared statement cache): the message that carries a marker is the
// one that runs its statement, on any connection, not a Parse sent on
// its own before it.
func cutPool(t testing.TB, s *pgtest.Server) (*redistest.Proxy, *pgxpool.Pool) {
	t.Helper()
	proxy, err := redistest.NewProxy(fmt.Sprintf("127.0.0.1:%d", s.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", proxy.Addr))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return proxy, db
}

// TestRollbackIsBounded: a group refused by its fence is rolled back, and
// a server that takes the ROLLBACK and never answers it (the proxy holds
// its reply) must not hold the apply, and with it the worker's lane, for
// ever: Apply returns the StaleFenceError once keylanepg's bound on a
// rollback passed (pgx then closes the connection, and the server rolls
// the transaction back when it sees it go), nothing of the refused group
// written. Before, the rollback ran under no deadline (the caller's
// context without its cancel) and Apply never returned. Run for both
// kinds of handler.
func TestRollbackIsBounded(t *testing.T) { forKinds(t, testRollbackIsBounded) }

func testRollbackIsBounded(t *testing.T, kind string) {
	s, direct := startShop(t, 4)
	proxy, db := cutPool(t, s)
	ctx := context.Background()
	setStock(t, direct, "rb", 5)
	if _, err := applyAs(ctx, kind, db, group(30, 2, buy("rb-new", "rb"))); err != nil {
		t.Fatal(err)
	}
	proxy.HoldAfter("rollback")
	done := make(chan error, 1)
	go func() {
		_, err := applyAs(ctx, kind, db, group(30, 1, buy("rb-old", "rb")))
		done <- err
	}()
	select {
	case err := <-done:
		if sf := (*keylanepg.StaleFenceError)(nil); !errors.As(err, &sf) {
			t.Fatalf("stale group: %v, want a StaleFenceError", err)
		}
	case <-time.After(30 * time.Second):
		// Closing the proxy ends the held connection, so the pool can
		// close when the test ends.
		_ = proxy.Close()
		t.Fatal("Apply of a stale group still waits on its ROLLBACK's answer after 30s")
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("%d held, want the ROLLBACK", proxy.Cuts())
	}
	if a := audit(t, direct, "rb"); a != (shop.Audit{Stock: 4, Orders: 1, Units: 1}) {
		t.Errorf("after the stale group: %+v, want only rb-new's sale", a)
	}
}
