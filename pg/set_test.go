package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// statements is a pgx tracer counting round trips and the statements
// sent in batches.
type statements struct {
	roundTrips
	queries atomic.Int64
}

func (s *statements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	s.queries.Add(1)
}

// TestSetSendsTheGroupInTwoRoundTrips applies one group of 40 purchases
// of five SKUs (one with no stock row, two selling out) and the shop's
// set and get, through ApplyPipeline and ApplySet: the same outcomes and
// rows; the set's transaction costs two round trips on a pool and three
// on one connection, as the pipeline's, and sends 8 statements (BEGIN,
// the fence, the outcomes look-up, the stock read; the stock write, the
// orders write, the record, COMMIT) where the pipeline's sends one more a
// job. Fails if the set answers or writes otherwise than the pipeline, or
// sends a statement a job.
func TestSetSendsTheGroupInTwoRoundTrips(t *testing.T) {
	ctx := context.Background()
	jobs := []keylane.Job{{ID: "s1", Key: "x", Payload: []byte("set 2")}, {ID: "g1", Key: "a", Payload: []byte("get")}}
	for i := range 40 {
		sku := string(rune('a' + i%5)) // e has no stock row
		jobs = append(jobs, buy(fmt.Sprintf("%s%02d", sku, i), sku))
	}
	jobs = append(jobs, keylane.Job{ID: "s2", Key: "x", Payload: []byte("buy 2")}, keylane.Job{ID: "g2", Key: "b", Payload: []byte("get")})
	type run struct {
		kind string
		conn bool
	}
	runs := []run{{"pipeline", false}, {"set", false}, {"set", true}}
	got := make([][]string, len(runs))
	for i, r := range runs {
		st := &statements{}
		pool := tracedShopWith(t, st)
		for sku, n := range map[string]int64{"a": 20, "b": 3, "c": 8, "d": 1} {
			setStock(t, pool, sku, n)
		}
		var db keylanepg.DB = pool
		if r.conn {
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			db = c.Conn()
		}
		st.n.Store(0)
		st.queries.Store(0)
		out, err := applyAs(ctx, r.kind, db, group(0, 1, jobs...))
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		trips, queries := st.n.Load(), st.queries.Load()
		got[i] = results(out)
		for _, sku := range []string{"a", "b", "c", "d", "e", "x"} {
			got[i] = append(got[i], fmt.Sprintf("sku %s %+v", sku, audit(t, pool, sku)))
		}
		t.Logf("%+v: %d round trips, %d statements in batches", r, trips, queries)
		wantTrips := int64(2)
		if r.conn {
			wantTrips = 3
		}
		if trips != wantTrips {
			t.Errorf("%+v: %d round trips, want %d", r, trips, wantTrips)
		}
		if r.kind == "set" && !r.conn && queries != 8 {
			t.Errorf("%+v: %d statements, want 8 whatever the number of jobs", r, queries)
		}
	}
	for i := 1; i < len(runs); i++ {
		if !slices.Equal(got[i], got[0]) {
			t.Errorf("%+v:\n got %q\nwant %q (the pipeline's)", runs[i], got[i], got[0])
		}
	}
}

// TestSetMatchesSell applies random groups of the shop's commands, on a
// few SKUs whose stock carries from one transaction to the next, through
// Apply with shop.Sell and through ApplySet with shop.SellSet: every
// outcome and every SKU's stock and orders must be the same. Set
// KEYLANE_SEED to replay a seed.
func TestSetMatchesSell(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KEYLANE_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (KEYLANE_SEED replays it)", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	_, db := startShop(t, 4)
	ctx := context.Background()
	skus := []string{"a", "b", "c", "d"}
	for _, sku := range skus[:3] { // d has no row until a set makes one
		n := int64(r.IntN(6))
		for _, kind := range []string{"handler", "set"} {
			setStock(t, db, kind+"-"+sku, n)
		}
	}
	cmds := []string{"buy 1", "buy 1", "buy 1", "buy 2", "buy 5", "get", "set 3", "set 0"}
	for round := range 30 {
		var picks []keylane.Job
		for i := range 1 + r.IntN(20) {
			picks = append(picks, keylane.Job{ID: fmt.Sprintf("%d-%d", round, i), Key: skus[r.IntN(len(skus))], Payload: []byte(cmds[r.IntN(len(cmds))])})
		}
		var got [2][]string
		for k, kind := range []string{"handler", "set"} {
			jobs := make([]keylane.Job, len(picks))
			for i, j := range picks {
				j.ID, j.Key = kind+"-"+j.ID, kind+"-"+j.Key
				jobs[i] = j
			}
			out, err := applyAs(ctx, kind, db, group(0, 1, jobs...))
			if err != nil {
				t.Fatalf("round %d, %s: %v", round, kind, err)
			}
			for i, o := range out {
				got[k] = append(got[k], fmt.Sprintf("%s %s %s", picks[i].Payload, o.Status, o.Result))
			}
			for _, sku := range skus {
				a := audit(t, db, kind+"-"+sku)
				got[k] = append(got[k], fmt.Sprintf("sku %s stock %d orders %d units %d", sku, a.Stock, a.Orders, a.Units))
			}
		}
		if !slices.Equal(got[1], got[0]) {
			t.Fatalf("round %d (seed %d):\nset  %q\nSell %q", round, seed, got[1], got[0])
		}
	}
}

// TestSetFailingJobFailsAlone is TestPipelineFailingJobRollsBackAlone for
// a SetHandler: a job of the set makes Read refuse (retriably, for good,
// by a panic), makes Write refuse or panic, gets a SetResult.Err, or has
// a write statement fail. The fast path cannot undo one job's writes, so
// it rolls back and applies the group one job at a time in savepoints:
// each failing job fails alone, its key's later jobs are held behind a
// retriable failure and run after a permanent one, and every other key's
// jobs commit once. Fails if a failure fails the group, commits a failed
// job's writes, or applies a job twice.
func TestSetFailingJobFailsAlone(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	for _, sku := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		setStock(t, db, sku, 5)
	}
	has := func(jobs []keylane.Job, id string) bool {
		return slices.ContainsFunc(jobs, func(j keylane.Job) bool { return j.ID == id })
	}
	h := keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
		switch {
		case has(jobs, "a-read"):
			return nil, errFlaky
		case has(jobs, "b-perm"):
			return nil, keylane.Permanent(errFlaky)
		case has(jobs, "c-panic"):
			panic("boom in Read")
		}
		w, err := shop.SellSet.Read(jobs, b)
		if err != nil {
			return nil, err
		}
		return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
			switch {
			case has(jobs, "d-write"):
				return nil, errFlaky
			case has(jobs, "e-panic"):
				panic("boom in Write")
			}
			rs, err := w(b)
			if err != nil {
				return nil, err
			}
			for i, j := range jobs {
				switch j.ID {
				case "f-result":
					rs[i].Err = errFlaky
				case "g-sql":
					b.Queue("SELECT 1/0")
				}
			}
			return rs, nil
		}, nil
	})
	out, err := keylanepg.ApplySet(ctx, db, group(0, 1,
		buy("a-read", "a"), buy("a2", "a"), buy("b-perm", "b"), buy("b2", "b"),
		buy("c-panic", "c"), buy("c2", "c"), buy("d-write", "d"), buy("d2", "d"),
		buy("e-panic", "e"), buy("e2", "e"), buy("f-result", "f"), buy("f2", "f"),
		buy("g-sql", "g"), buy("g2", "g"), buy("h1", "h"), buy("h2", "h"),
	), h)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]keylanepg.Status{
		"a-read": keylanepg.Failed, "a2": keylanepg.Held,
		"b-perm": keylanepg.Failed, "b2": keylanepg.Applied,
		"c-panic": keylanepg.Failed, "c2": keylanepg.Held,
		"d-write": keylanepg.Failed, "d2": keylanepg.Held,
		"e-panic": keylanepg.Failed, "e2": keylanepg.Held,
		"f-result": keylanepg.Failed, "f2": keylanepg.Held,
		"g-sql": keylanepg.Failed, "g2": keylanepg.Held,
		"h1": keylanepg.Applied, "h2": keylanepg.Applied,
	}
	for _, o := range out {
		if o.Status != want[o.JobID] {
			t.Errorf("%s: %s (err %v), want %s", o.JobID, o.Status, o.Err, want[o.JobID])
		}
	}
	if o := out[2]; !errors.Is(o.Err, keylane.ErrPermanent) {
		t.Errorf("b-perm's error is not permanent: %v", o.Err)
	}
	if o := out[0]; !errors.Is(o.Err, errFlaky) || errors.Is(o.Err, keylane.ErrPermanent) {
		t.Errorf("a-read's error: %v", o.Err)
	}
	for sku, units := range map[string]int64{"a": 0, "b": 1, "c": 0, "d": 0, "e": 0, "f": 0, "g": 0, "h": 2} {
		if a := audit(t, db, sku); a != (shop.Audit{Stock: 5 - units, Orders: units, Units: units}) {
			t.Errorf("sku %s: %+v, want %d sold", sku, a, units)
		}
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes`); n != 3 {
		t.Errorf("%d outcomes recorded, want 3 (b2, h1, h2)", n)
	}
}

// TestSetHandlerBugsFailForGood: a Read that returns no Write, or a Write
// that returns a result count other than its jobs', cannot be cured by a
// retry: the job fails permanently (dead-lettered by a worker), not
// retriably (retried for ever). Fails if either is retriable.
func TestSetHandlerBugsFailForGood(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	setStock(t, db, "a", 5)
	for name, h := range map[string]keylanepg.SetHandler{
		"no Write": keylanepg.SetFunc(func([]keylane.Job, *pgx.Batch) (keylanepg.Write, error) { return nil, nil }),
		"one result too many": keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
			return func(*pgx.Batch) ([]keylanepg.SetResult, error) {
				return make([]keylanepg.SetResult, len(jobs)+1), nil
			}, nil
		}),
	} {
		out, err := keylanepg.ApplySet(ctx, db, group(0, 1, buy("x-"+name, "a"), buy("y-"+name, "a")), h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, o := range out {
			if o.Status != keylanepg.Failed || !errors.Is(o.Err, keylane.ErrPermanent) {
				t.Errorf("%s: %s %s (err %v), want failed for good", name, o.JobID, o.Status, o.Err)
			}
		}
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 5}) {
		t.Errorf("sku a: %+v, want nothing sold", a)
	}
}

// TestSetAnswersRecordedJobsFromTheRecord redelivers an applied group
// with a new job in it, and applies a group that names one ID twice,
// through ApplySet: the recorded jobs are answered from the record
// (Recorded), only the new ones applied. Fails if a redelivered or
// repeated job is applied again.
func TestSetAnswersRecordedJobsFromTheRecord(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	first, err := keylanepg.ApplySet(ctx, db, group(0, 1, buy("j1", "a"), buy("j2", "a")), shop.SellSet)
	if err != nil {
		t.Fatal(err)
	}
	again, err := keylanepg.ApplySet(ctx, db, group(0, 1, buy("j1", "a"), buy("j2", "a"), buy("j3", "a"), buy("j3", "a")), shop.SellSet)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"j1 recorded sold 9", "j2 recorded sold 8", "j3 applied sold 7", "j3 recorded sold 7"}
	if got := results(again); !slices.Equal(got, want) {
		t.Errorf("redelivered: %q, want %q (first %q)", got, want, results(first))
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 7, Orders: 3, Units: 3}) {
		t.Errorf("sku a: %+v, want 3 sold once each", a)
	}
}

// TestSetStaleFenceChangesNothing: a set applied under a fence older than
// the committed one fails with a *StaleFenceError at the database, and
// its reads and writes leave no row. Fails if the set writes or records
// anything under the old fence.
func TestSetStaleFenceChangesNothing(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	setStock(t, db, "a", 5)
	if _, err := keylanepg.ApplySet(ctx, db, group(3, 7, buy("new", "a")), shop.SellSet); err != nil {
		t.Fatal(err)
	}
	_, err := keylanepg.ApplySet(ctx, db, group(3, 6, buy("old1", "a"), buy("old2", "a")), shop.SellSet)
	var sf *keylanepg.StaleFenceError
	if !errors.As(err, &sf) || sf.Committed != 7 || !errors.Is(err, keylane.ErrStaleFence) {
		t.Fatalf("old fence: %v, want a StaleFenceError with committed fence 7", err)
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 4, Orders: 1, Units: 1}) {
		t.Errorf("sku a: %+v, want the new owner's one sale only", a)
	}
}

// TestREADMESetSell runs the README's SetHandler (readmeSetSell, in
// example_test.go) against a real database: two SKUs' purchases in one
// group, sold until the stock runs out, one order row a sale, and checks
// that the README shows it as written.
func TestREADMESetSell(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	setStock(t, db, "a", 2)
	setStock(t, db, "b", 1)
	out, err := keylanepg.ApplySet(ctx, db, group(0, 1, buy("a1", "a"), buy("b1", "b"), buy("a2", "a"), buy("b2", "b"), buy("a3", "a"), buy("c1", "c")), readmeSetSell)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a1 applied sold", "b1 applied sold", "a2 applied sold", "b2 applied soldout", "a3 applied soldout", "c1 applied soldout"}
	if got := results(out); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if a, b := audit(t, db, "a"), audit(t, db, "b"); a != (shop.Audit{Stock: 0, Orders: 2, Units: 2}) || b != (shop.Audit{Stock: 0, Orders: 1, Units: 1}) {
		t.Errorf("sku a %+v, b %+v: want each sold out, one order row a sale", a, b)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	const start = "keylanepg.SetFunc(func("
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := funcLiteral(t, "README.md", string(readme), start), funcLiteral(t, "example_test.go", string(src), start); got != want {
		t.Errorf("README.md's SetFunc is not readmeSetSell:\n%s\nwant\n%s", got, want)
	}
}

// TestCallbackPanicFailsTheJobAlone: a job's statement whose pgx callback
// panics (a row it cannot decode) fails that job alone, for a set's Read
// and for a pipeline's statement, and leaves no session idle in its
// transaction: the partition's next transaction takes the fence row at
// once. Failed before: the panic left the lent connection idle in the
// transaction, holding the fence row's lock, and the next apply of the
// partition waited on it until its deadline.
func TestCallbackPanicFailsTheJobAlone(t *testing.T) {
	for _, kind := range []string{"pipeline", "set"} {
		t.Run(kind, func(t *testing.T) {
			_, db := startShop(t, 2)
			setStock(t, db, "a", 5)
			setStock(t, db, "b", 5)
			jobs := []keylane.Job{buy("a1", "a"), buy("p1", "b"), buy("a2", "a")}
			apply := func(ctx context.Context, g keylanepg.Group) ([]keylanepg.Outcome, error) {
				if kind == "set" {
					return keylanepg.ApplySet(ctx, db, g, keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
						if slices.ContainsFunc(jobs, func(j keylane.Job) bool { return j.ID == "p1" }) {
							b.Queue(`SELECT 1`).QueryRow(func(pgx.Row) error { panic("a row it cannot decode") })
						}
						return shop.SellSet.Read(jobs, b)
					}))
				}
				return keylanepg.ApplyPipeline(ctx, db, g, keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
					if job.ID == "p1" {
						b.Queue(`SELECT 1`).QueryRow(func(pgx.Row) error { panic("a row it cannot decode") })
					}
					return shop.SellPipeline.Queue(job, b)
				}))
			}
			out, err := func() (out []keylanepg.Outcome, err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("apply panicked: %v", r)
					}
				}()
				return apply(context.Background(), group(0, 1, jobs...))
			}()
			if err != nil {
				t.Errorf("apply: %v, want p1 failed alone and the rest applied", err)
			} else if got, want := fmt.Sprint(out[0].Status, out[1].Status, out[2].Status), "applied failed applied"; got != want {
				t.Errorf("outcomes %s, want %s (p1 failed alone): %+v", got, want, out)
			}
			if n := rowCount(t, db, `SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'`); n != 0 {
				t.Errorf("%d sessions idle in a transaction after the panic", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := keylanepg.ApplySet(ctx, db, group(0, 1, buy("a3", "a")), shop.SellSet); err != nil {
				t.Fatalf("the partition's next transaction: %v", err)
			}
		})
	}
}

// TestSetWriteFailureTakesTheCarefulPath: in a set that reads fine, one
// job's write fails at the server (the fast path's writes go with the
// record and COMMIT: the server skips them all), or one job's SetResult
// has an Err: the fast path must roll back and take the careful path, so
// that the job fails alone and the rest commit. Each case is a group of
// its own, so nothing else sends the group the careful way. Failed with
// the careful fallback after the writes removed: the whole group failed
// ("writes and record outcomes: division by zero").
func TestSetWriteFailureTakesTheCarefulPath(t *testing.T) {
	for _, tc := range []struct{ name, bad string }{{"write fails at the server", "b-sql"}, {"a job's Err", "b-err"}} {
		t.Run(tc.name, func(t *testing.T) {
			_, db := startShop(t, 2)
			for _, sku := range []string{"a", "b"} {
				setStock(t, db, sku, 5)
			}
			h := keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
				w, err := shop.SellSet.Read(jobs, b)
				if err != nil {
					return nil, err
				}
				return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
					rs, err := w(b)
					for i, j := range jobs {
						switch j.ID {
						case "b-sql":
							b.Queue(`SELECT 1/0`)
						case "b-err":
							rs[i].Err = keylane.Permanent(errFlaky)
						}
					}
					return rs, err
				}, nil
			})
			out, err := keylanepg.ApplySet(context.Background(), db, group(0, 1, buy("a1", "a"), buy(tc.bad, "b"), buy("a2", "a")), h)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"a1 applied sold 4", tc.bad + " failed", "a2 applied sold 3"}
			for i, o := range out {
				if got := strings.TrimSpace(fmt.Sprintf("%s %s %s", o.JobID, o.Status, o.Result)); got != want[i] {
					t.Errorf("%s, want %s (err %v)", got, want[i], o.Err)
				}
			}
			for sku, units := range map[string]int64{"a": 2, "b": 0} {
				if a := audit(t, db, sku); a != (shop.Audit{Stock: 5 - units, Orders: units, Units: units}) {
					t.Errorf("sku %s: %+v, want %d sold", sku, a, units)
				}
			}
		})
	}
}

// TestSetWriteCallbacksAreRefused: Write's statements go with COMMIT, so
// nothing they return can change a job's result: a callback on one
// (QueryRow, Query, Exec) could only fail after the server committed, and
// the job would be answered as applied. Such a Write fails its jobs for
// good, before anything is sent. Failed before on a pool: the callback's
// error came back as the commit's unknown fate, and the retry found the
// job recorded as sold.
func TestSetWriteCallbacksAreRefused(t *testing.T) {
	_, db := startShop(t, 2)
	setStock(t, db, "a", 5)
	h := keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
		w, err := shop.SellSet.Read(jobs, b)
		if err != nil {
			return nil, err
		}
		return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
			rs, err := w(b)
			b.Queue(`UPDATE stock SET n = n WHERE sku = 'nosuch'`).Exec(func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() == 0 {
					return errors.New("conditional write missed")
				}
				return nil
			})
			return rs, err
		}, nil
	})
	out, err := keylanepg.ApplySet(context.Background(), db, group(0, 1, buy("x1", "a")), h)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if o := out[0]; o.Status != keylanepg.Failed || !errors.Is(o.Err, keylane.ErrPermanent) {
		t.Errorf("x1: %s %v, want failed for good", o.Status, o.Err)
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 5}) {
		t.Errorf("sku a: %+v, want nothing sold", a)
	}
}
