package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// TestGroupOfSeveralKeysAppliesEachJobOnce applies one group of two SKUs'
// interleaved purchases: each job runs once, in its key's order, a sold-out
// purchase is a result, and every applied job's outcome is recorded with
// its rows.
func TestGroupOfSeveralKeysAppliesEachJobOnce(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 3)
	setStock(t, db, "b", 1)
	ids := []string{"a1", "b1", "a2", "b2", "a3"}
	h := count(shop.Sell, ids...)
	out, err := keylanepg.Apply(ctx, db, group(0, 1, buy("a1", "a"), buy("b1", "b"), buy("a2", "a"), buy("b2", "b"), buy("a3", "a")), h)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a1 applied sold 2", "b1 applied sold 0", "a2 applied sold 1", "b2 applied soldout 0", "a3 applied sold 0"}
	if got := results(out); !slices.Equal(got, want) {
		t.Fatalf("outcomes:\n got %q\nwant %q", got, want)
	}
	for id, n := range h.runs {
		if n.Load() != 1 {
			t.Errorf("job %s ran %d times, want 1", id, n.Load())
		}
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 0, Orders: 3, Units: 3}) {
		t.Errorf("sku a: %+v", a)
	}
	if a := audit(t, db, "b"); a != (shop.Audit{Stock: 0, Orders: 1, Units: 1}) {
		t.Errorf("sku b: %+v", a)
	}
	got, err := keylanepg.Lookup(ctx, db, ns, append(ids, "never"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("Lookup found %d outcomes, want %d: %v", len(got), len(ids), got)
	}
	for _, o := range out {
		r := got[o.JobID]
		if r.Status != keylanepg.Recorded || string(r.Result) != string(o.Result) || r.Key != o.Key || r.Fence != 1 || !r.At.Equal(o.At) {
			t.Errorf("Lookup %s = %+v, applied as %+v", o.JobID, r, o)
		}
	}
}

// TestRedeliveredGroupIsAnsweredFromTheRecord applies a group, then the
// same group again, as a worker killed between the commit and the ack
// would have it redelivered (to itself or to a new owner with a higher
// fence): nothing runs again, every job is answered with its recorded
// result, and a new job in the redelivered group is applied.
func TestRedeliveredGroupIsAnsweredFromTheRecord(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	jobs := []keylane.Job{buy("j1", "a"), buy("j2", "a"), buy("j3", "a")}
	first, err := keylanepg.Apply(ctx, db, group(0, 1, jobs...), shop.Sell)
	if err != nil {
		t.Fatal(err)
	}
	// The same owner (fence 1) redelivered, then a new owner (fence 2):
	// each round adds one new job to the redelivered ones.
	for round, fence := range []uint64{1, 2} {
		fresh := fmt.Sprintf("new%d", round)
		h := count(shop.Sell, fresh)
		for _, j := range jobs {
			h.runs[j.ID] = new(atomic.Int64)
		}
		again, err := keylanepg.Apply(ctx, db, group(0, fence, append(jobs, buy(fresh, "a"))...), h)
		if err != nil {
			t.Fatalf("fence %d: %v", fence, err)
		}
		for i := range first {
			if again[i].Status != keylanepg.Recorded || string(again[i].Result) != string(first[i].Result) || again[i].Fence != 1 || !again[i].At.Equal(first[i].At) {
				t.Errorf("fence %d: redelivered %s = %+v, first applied as %+v", fence, jobs[i].ID, again[i], first[i])
			}
		}
		if o := again[len(jobs)]; o.Status != keylanepg.Applied || o.Fence != fence {
			t.Errorf("fence %d: new job %s = %+v, want applied", fence, fresh, o)
		}
		if n := h.total() - h.runs[fresh].Load(); n != 0 {
			t.Errorf("fence %d: redelivered jobs ran %d times, want 0", fence, n)
		}
		jobs = append(jobs, buy(fresh, "a"))
	}
	// j1-j3 and the two new jobs, once each: 5 units.
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 5, Orders: 5, Units: 5}) {
		t.Errorf("audit: %+v", a)
	}
}

var errFlaky = errors.New("flaky")

// TestFailingJobRollsBackAlone runs a group in which jobs fail after
// writing: by returning an error, by a failing statement, by a panic, and
// permanently. Each failed job's writes are rolled back alone (its
// savepoint) and it is not recorded; the key's later jobs are held back
// behind a retriable failure (order), run after a permanent one
// (dead-lettered), and every other key's jobs commit.
func TestFailingJobRollsBackAlone(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	for _, sku := range []string{"a", "b", "c", "d", "e"} {
		setStock(t, db, sku, 5)
	}
	h := keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		res, err := shop.Sell.Handle(ctx, tx, job) // writes first
		if err != nil {
			return nil, err
		}
		switch string(job.ID) {
		case "a-flaky":
			return nil, errFlaky
		case "b-sql":
			_, err := tx.Exec(ctx, "SELECT 1/0")
			return nil, err
		case "c-panic":
			panic("boom")
		case "d-perm":
			return nil, keylane.Permanent(errFlaky)
		case "e-commit":
			if err := tx.Commit(ctx); !errors.Is(err, keylanepg.ErrTxOwned) {
				return nil, fmt.Errorf("Commit by a handler: %v, want ErrTxOwned", err)
			}
		}
		return res, nil
	})
	out, err := keylanepg.Apply(ctx, db, group(0, 1,
		buy("a1", "a"), buy("a-flaky", "a"), buy("b-sql", "b"), buy("a2", "a"), buy("b2", "b"),
		buy("c-panic", "c"), buy("d-perm", "d"), buy("d2", "d"), buy("c2", "c"), buy("e-commit", "e"),
	), h)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]keylanepg.Status{
		"a1": keylanepg.Applied, "a-flaky": keylanepg.Failed, "a2": keylanepg.Held,
		"b-sql": keylanepg.Failed, "b2": keylanepg.Held,
		"c-panic": keylanepg.Failed, "c2": keylanepg.Held,
		"d-perm": keylanepg.Failed, "d2": keylanepg.Applied,
		"e-commit": keylanepg.Applied,
	}
	for _, o := range out {
		if o.Status != want[o.JobID] {
			t.Errorf("%s: %s (err %v), want %s", o.JobID, o.Status, o.Err, want[o.JobID])
		}
	}
	if !errors.Is(out[1].Err, errFlaky) || errors.Is(out[1].Err, keylane.ErrPermanent) {
		t.Errorf("a-flaky's error: %v", out[1].Err)
	}
	if !errors.Is(out[6].Err, keylane.ErrPermanent) {
		t.Errorf("d-perm's error is not permanent: %v", out[6].Err)
	}
	// Rows: only a1, d2 and e-commit sold.
	for sku, units := range map[string]int64{"a": 1, "b": 0, "c": 0, "d": 1, "e": 1} {
		if a := audit(t, db, sku); a != (shop.Audit{Stock: 5 - units, Orders: units, Units: units}) {
			t.Errorf("sku %s: %+v, want %d sold", sku, a, units)
		}
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes`); n != 3 {
		t.Errorf("%d outcomes recorded, want 3 (a1, d2, e-commit)", n)
	}
}

// TestJSONHandler applies the shop's JSON purchase, through Apply
// (shop.SellJSON) and ApplyPipeline (shop.SellJSONPipeline): a good
// request is applied with a JSON result, a payload that does not decode
// fails permanently and writes nothing.
// TestJSONHandler runs for the Handler and the PipelineHandler: a set
// handler has no JSON variant (SetFunc decodes what it wants).
func TestJSONHandler(t *testing.T) {
	for _, kind := range []string{"handler", "pipeline"} {
		t.Run(kind, func(t *testing.T) { testJSONHandler(t, kind) })
	}
}

func testJSONHandler(t *testing.T, kind string) {
	_, db := startShop(t, 2)
	setStock(t, db, "a", 1)
	g := group(0, 1,
		keylane.Job{ID: "j1", Key: "a", Payload: []byte(`{"qty":1}`)},
		keylane.Job{ID: "j2", Key: "a", Payload: []byte(`not json`)},
		keylane.Job{ID: "j3", Key: "a", Payload: []byte(`{"qty":1}`)},
	)
	var out []keylanepg.Outcome
	var err error
	if kind == "pipeline" {
		out, err = keylanepg.ApplyPipeline(context.Background(), db, g, shop.SellJSONPipeline)
	} else {
		out, err = keylanepg.Apply(context.Background(), db, g, shop.SellJSON)
	}
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`j1 applied {"sold":true,"left":0}`, `j3 applied {"sold":false,"left":0}`}
	if got := results([]keylanepg.Outcome{out[0], out[2]}); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if out[1].Status != keylanepg.Failed || !errors.Is(out[1].Err, keylane.ErrPermanent) {
		t.Errorf("bad payload: %+v", out[1])
	}
}

// TestShopCommands runs the shop's other commands through Apply: set and
// get answer as the inventory handler does, and a command that is not the
// shop's fails permanently.
func TestShopCommands(t *testing.T) {
	_, db := startShop(t, 2)
	out, err := keylanepg.Apply(context.Background(), db, group(0, 1,
		keylane.Job{ID: "s1", Key: "x", Payload: []byte("set 2")},
		keylane.Job{ID: "s2", Key: "x", Payload: []byte("buy 2")},
		keylane.Job{ID: "s3", Key: "x", Payload: []byte("get")},
		keylane.Job{ID: "s4", Key: "y", Payload: []byte("buy 1")},
		keylane.Job{ID: "s5", Key: "x", Payload: []byte("restock 1")},
	), shop.Sell)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"s1 applied ok 2", "s2 applied sold 0", "s3 applied stock 0", "s4 applied soldout 0"}
	if got := results(out[:4]); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if out[4].Status != keylanepg.Failed || !errors.Is(out[4].Err, keylane.ErrPermanent) {
		t.Errorf("restock: %+v, want a permanent failure", out[4])
	}
	if a := audit(t, db, "x"); a != (shop.Audit{Stock: 0, Orders: 1, Units: 2}) {
		t.Errorf("audit: %+v", a)
	}
}

// TestPruneForgetsOutcomes prunes the outcomes recorded before a time:
// only those go, and a pruned job that comes back is applied again, as
// Prune warns.
func TestPruneForgetsOutcomes(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	if _, err := keylanepg.Apply(ctx, db, group(0, 1, buy("old", "a")), shop.Sell); err != nil {
		t.Fatal(err)
	}
	var cut time.Time
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	if _, err := keylanepg.Apply(ctx, db, group(0, 1, buy("new", "a")), shop.Sell); err != nil {
		t.Fatal(err)
	}
	n, err := keylanepg.Prune(ctx, db, ns, cut)
	if err != nil || n != 1 {
		t.Fatalf("Prune: %d, %v; want 1 pruned", n, err)
	}
	out, err := keylanepg.Apply(ctx, db, group(0, 1, buy("new", "a"), keylane.Job{ID: "old", Key: "a", Payload: []byte("get")}), shop.Sell)
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Status != keylanepg.Recorded || out[1].Status != keylanepg.Applied {
		t.Errorf("after Prune: %q, want new recorded, old applied again", results(out))
	}
}
