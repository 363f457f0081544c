package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// roundTrips is a pgx tracer counting what goes to the server: a
// statement, or a batch (one round trip however many statements).
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// tracedShop is startShop with every round trip of the pool counted.
func tracedShop(t *testing.T) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	rt := new(roundTrips)
	return tracedShopWith(t, rt), rt
}

// tracedShopWith is startShop with tr tracing the pool's statements.
func tracedShopWith(t *testing.T, tr pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	s, _ := startShop(t, 2)
	cfg, err := pgxpool.ParseConfig(s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 2
	traced, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	return traced
}

// TestPipelineSendsTheGroupInTwoRoundTrips applies the same group of
// two SKUs' purchases and the shop's other commands through Apply
// (shop.Sell), through ApplyPipeline (shop.SellPipeline) and through
// ApplySet (shop.SellSet, whose careful path runs: s5 fails): the same
// outcomes and rows, and the pipeline's transaction costs two round
// trips on a pool (begin, fence, outcomes and every job's statements;
// the record with COMMIT), three on one connection (a pgx.Tx commits in
// a round trip of its own), where the Handler's costs at least one per
// statement. Fails if the pipeline answers or writes differently, sends
// a job's statements on their own, or commits apart from the record on a
// pool (three round trips before the lent connection).
func TestPipelineSendsTheGroupInTwoRoundTrips(t *testing.T) {
	ctx := context.Background()
	jobs := []keylane.Job{
		{ID: "s1", Key: "x", Payload: []byte("set 2")},
		buy("a1", "a"), buy("b1", "b"), buy("a2", "a"), buy("b2", "b"), buy("a3", "a"),
		{ID: "s2", Key: "x", Payload: []byte("buy 2")},
		{ID: "s3", Key: "x", Payload: []byte("get")},
		{ID: "s4", Key: "y", Payload: []byte("buy 1")},
		{ID: "s5", Key: "x", Payload: []byte("restock 1")},
		{ID: "s6", Key: "y", Payload: []byte("get")},
	}
	// The pipeline again on one connection (a DB that lends none).
	runs := append(slices.Clone(applyKinds), "pipeline on a connection")
	got := make([][]string, len(runs))
	trips := make([]int64, len(runs))
	for i, kind := range runs {
		pool, rt := tracedShop(t)
		for sku, n := range map[string]int64{"a": 3, "b": 1} {
			if _, err := pool.Exec(ctx, `INSERT INTO stock (sku, n) VALUES ($1, $2)`, sku, n); err != nil {
				t.Fatal(err)
			}
		}
		var db keylanepg.DB = pool
		if kind == "pipeline on a connection" {
			c, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			db, kind = c.Conn(), "pipeline"
		}
		rt.n.Store(0)
		out, err := applyAs(ctx, kind, db, group(0, 1, jobs...))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		trips[i] = rt.n.Load()
		for _, o := range out {
			got[i] = append(got[i], fmt.Sprintf("%s %s %s permanent=%v", o.JobID, o.Status, o.Result, errors.Is(o.Err, keylane.ErrPermanent)))
		}
		for _, sku := range []string{"a", "b", "x", "y"} {
			a, err := shop.AuditSKU(ctx, pool, ns, sku)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append(got[i], fmt.Sprintf("sku %s %+v", sku, a))
		}
	}
	want := []string{
		"s1 applied ok 2 permanent=false",
		"a1 applied sold 2 permanent=false", "b1 applied sold 0 permanent=false", "a2 applied sold 1 permanent=false",
		"b2 applied soldout 0 permanent=false", "a3 applied sold 0 permanent=false",
		"s2 applied sold 0 permanent=false", "s3 applied stock 0 permanent=false", "s4 applied soldout 0 permanent=false",
		"s5 failed  permanent=true", "s6 applied stock 0 permanent=false",
		"sku a {Stock:0 Orders:3 Units:3 OrdersWithoutOutcome:0 SoldWithoutOrder:0}",
		"sku b {Stock:0 Orders:1 Units:1 OrdersWithoutOutcome:0 SoldWithoutOrder:0}",
		"sku x {Stock:0 Orders:1 Units:2 OrdersWithoutOutcome:0 SoldWithoutOrder:0}",
		"sku y {Stock:0 Orders:0 Units:0 OrdersWithoutOutcome:0 SoldWithoutOrder:0}",
	}
	for i, kind := range runs {
		if !slices.Equal(got[i], want) {
			t.Errorf("%s:\n got %q\nwant %q", kind, got[i], want)
		}
	}
	t.Logf("round trips of one transaction of %d jobs: handler %d, pipeline %d, set %d (its careful path: s5 fails), pipeline on a connection %d", len(jobs), trips[0], trips[1], trips[2], trips[3])
	if trips[1] != 2 {
		t.Errorf("the pipeline's transaction took %d round trips on a pool, want 2", trips[1])
	}
	if trips[3] != 3 {
		t.Errorf("the pipeline's transaction took %d round trips on a connection, want 3", trips[3])
	}
	if trips[0] <= int64(len(jobs)) {
		t.Errorf("the Handler's transaction took %d round trips for %d jobs, want one a statement at least", trips[0], len(jobs))
	}
}

// TestPipelineFailingJobRollsBackAlone is TestFailingJobRollsBackAlone
// for a PipelineHandler: jobs fail after their statements ran (the Result
// errs, a statement fails, the Result panics), before anything was sent
// (Queue errs, permanently or after queueing, or panics). The fast path
// cannot undo one job's statements, so it rolls back and applies the
// group the careful way: each failed job's writes are undone alone, the
// key's later jobs are held behind a retriable failure and run after a
// permanent one, every other key's jobs commit, and no job's writes are
// applied twice. Fails if a failed job's writes commit, or the group's
// other jobs are lost with it.
func TestPipelineFailingJobRollsBackAlone(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	for _, sku := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		setStock(t, db, sku, 5)
	}
	p := keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
		switch job.ID {
		case "e-queue":
			shop.QueueBuy(b, job.Key, job.ID, 1) // queued, then refused: dropped
			return nil, errFlaky
		case "f-perm":
			return nil, keylane.Permanent(errFlaky)
		case "g-panic":
			panic("boom in Queue")
		}
		res, err := shop.SellPipeline.Queue(job, b) // writes first
		if err != nil {
			return nil, err
		}
		switch job.ID {
		case "a-flaky":
			return func() ([]byte, error) { return nil, errFlaky }, nil
		case "b-sql":
			b.Queue("SELECT 1/0")
		case "c-panic":
			return func() ([]byte, error) { panic("boom in Result") }, nil
		}
		return res, nil
	})
	out, err := keylanepg.ApplyPipeline(ctx, db, group(0, 1,
		buy("a1", "a"), buy("a-flaky", "a"), buy("b-sql", "b"), buy("a2", "a"), buy("b2", "b"),
		buy("c-panic", "c"), buy("d1", "d"), buy("c2", "c"), buy("e-queue", "e"), buy("e2", "e"),
		buy("f-perm", "f"), buy("f2", "f"), buy("g-panic", "g"), buy("g2", "g"),
	), p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]keylanepg.Status{
		"a1": keylanepg.Applied, "a-flaky": keylanepg.Failed, "a2": keylanepg.Held,
		"b-sql": keylanepg.Failed, "b2": keylanepg.Held,
		"c-panic": keylanepg.Failed, "c2": keylanepg.Held,
		"d1":      keylanepg.Applied,
		"e-queue": keylanepg.Failed, "e2": keylanepg.Held,
		"f-perm": keylanepg.Failed, "f2": keylanepg.Applied,
		"g-panic": keylanepg.Failed, "g2": keylanepg.Held,
	}
	for _, o := range out {
		if o.Status != want[o.JobID] {
			t.Errorf("%s: %s (err %v), want %s", o.JobID, o.Status, o.Err, want[o.JobID])
		}
	}
	if o := out[10]; !errors.Is(o.Err, keylane.ErrPermanent) {
		t.Errorf("f-perm's error is not permanent: %v", o.Err)
	}
	if o := out[1]; !errors.Is(o.Err, errFlaky) || errors.Is(o.Err, keylane.ErrPermanent) {
		t.Errorf("a-flaky's error: %v", o.Err)
	}
	for sku, units := range map[string]int64{"a": 1, "b": 0, "c": 0, "d": 1, "e": 0, "f": 1, "g": 0} {
		if a := audit(t, db, sku); a != (shop.Audit{Stock: 5 - units, Orders: units, Units: units}) {
			t.Errorf("sku %s: %+v, want %d sold", sku, a, units)
		}
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes`); n != 3 {
		t.Errorf("%d outcomes recorded, want 3 (a1, d1, f2)", n)
	}
}

// TestPipelineAnswersRecordedJobsFromTheRecord redelivers an applied
// group with a new job in it, and applies a group that names one ID
// twice: the fast path, which ran every job's statements before it read
// the record, must roll back and answer the recorded jobs from the record
// (Recorded), applying only the new ones. Fails if a redelivered or
// repeated job is applied again (its order row twice, the stock down
// twice).
func TestPipelineAnswersRecordedJobsFromTheRecord(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	first, err := keylanepg.ApplyPipeline(ctx, db, group(0, 1, buy("j1", "a"), buy("j2", "a")), shop.SellPipeline)
	if err != nil {
		t.Fatal(err)
	}
	again, err := keylanepg.ApplyPipeline(ctx, db, group(0, 2, buy("j1", "a"), buy("j2", "a"), buy("j3", "a")), shop.SellPipeline)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"j1 recorded sold 9", "j2 recorded sold 8", "j3 applied sold 7"}
	if got := results(again); !slices.Equal(got, want) {
		t.Errorf("redelivered:\n got %q\nwant %q (first %q)", got, want, results(first))
	}
	twice, err := keylanepg.ApplyPipeline(ctx, db, group(0, 2, buy("j4", "a"), buy("j4", "a"), buy("j5", "a")), shop.SellPipeline)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"j4 applied sold 6", "j4 recorded sold 6", "j5 applied sold 5"}
	if got := results(twice); !slices.Equal(got, want) {
		t.Errorf("one ID twice:\n got %q\nwant %q", got, want)
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 5, Orders: 5, Units: 5}) {
		t.Errorf("audit: %+v, want 5 sold", a)
	}
}

// TestPipelineStaleFenceChangesNothing: a group under an older fence than
// the partition's committed one, its statements already sent in the
// fence's round trip, is refused with a StaleFenceError and writes
// nothing. Fails if the statements that rode with the fence commit.
func TestPipelineStaleFenceChangesNothing(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	if _, err := keylanepg.ApplyPipeline(ctx, db, group(0, 2, buy("new1", "a")), shop.SellPipeline); err != nil {
		t.Fatal(err)
	}
	_, err := keylanepg.ApplyPipeline(ctx, db, group(0, 1, buy("old1", "a"), buy("old2", "a")), shop.SellPipeline)
	var sf *keylanepg.StaleFenceError
	if !errors.As(err, &sf) || sf.Fence != 1 || sf.Committed != 2 || !errors.Is(err, keylane.ErrStaleFence) {
		t.Fatalf("stale group: %v, want a StaleFenceError of fence 1 against 2", err)
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 9, Orders: 1, Units: 1}) {
		t.Errorf("audit after the stale group: %+v", a)
	}
	if got, _ := keylanepg.Lookup(ctx, db, ns, []string{"old1", "old2"}); len(got) != 0 {
		t.Errorf("the stale group's jobs are recorded: %v", got)
	}
}

// TestApplierNeedsOneKindOfHandler: an Applier with both a Handler and a
// Pipeline, or neither, refuses every group permanently (a configuration
// no retry cures), writing nothing.
func TestApplierNeedsOneKindOfHandler(t *testing.T) {
	_, db := startShop(t, 2)
	setStock(t, db, "a", 1)
	for name, a := range map[string]*keylanepg.Applier{
		"both":    {DB: db, Handler: shop.Sell, Pipeline: shop.SellPipeline},
		"neither": {DB: db},
	} {
		_, err := a.ApplyGroup(context.Background(), keylane.JobGroup{Namespace: ns, Fence: 1, Jobs: []keylane.Job{buy("j1", "a")}})
		if err == nil || !errors.Is(err, keylane.ErrPermanent) {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
	}
	if a := audit(t, db, "a"); a.Orders != 0 {
		t.Errorf("audit: %+v", a)
	}
}

// TestWorkerRefusesAMisconfiguredApplier: NewWorker refuses an Applier
// without a DB or without exactly one of Handler and Pipeline, naming
// what is wrong, before it starts. Before, NewWorker took it, the worker
// started, and the first job's apply was refused for good: held at ERROR
// until an operator read the log.
func TestWorkerRefusesAMisconfiguredApplier(t *testing.T) {
	_, db := startShop(t, 2)
	nc, err := nats.Connect(natstest.Start(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for name, a := range map[string]*keylanepg.Applier{
		"both":    {DB: db, Handler: shop.Sell, Pipeline: shop.SellPipeline},
		"neither": {DB: db},
		"no DB":   {Pipeline: shop.SellPipeline},
	} {
		_, err := keylane.NewWorker(nc, keylane.WorkerConfig{Topology: keylane.TopologyConfig{Namespace: ns}, Applier: a})
		if err == nil || !strings.Contains(err.Error(), "keylanepg: Applier needs a DB") {
			t.Errorf("%s: NewWorker took the Applier (err %v); want its refusal", name, err)
		}
	}
}

// TestREADMEPipelineSell runs the README's PipelineHandler (readmeSell, in
// example_test.go) against a real database: two SKUs' purchases in one
// group, sold until the stock runs out, one order row a sale.
func TestREADMEPipelineSell(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	setStock(t, db, "a", 2)
	setStock(t, db, "b", 1)
	out, err := keylanepg.ApplyPipeline(ctx, db, group(0, 1, buy("a1", "a"), buy("b1", "b"), buy("a2", "a"), buy("b2", "b"), buy("a3", "a")), readmeSell)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a1 applied sold", "b1 applied sold", "a2 applied sold", "b2 applied soldout", "a3 applied soldout"}
	if got := results(out); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM orders`); n != 3 {
		t.Errorf("%d order rows, want 3", n)
	}
	// The README and docs/database.md show readmeSell as written.
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	want = []string{pipelineFunc(t, "example_test.go", string(src))}
	for _, doc := range []string{"../README.md", "../docs/database.md"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if got := pipelineFunc(t, doc, string(text)); got != want[0] {
			t.Errorf("%s's PipelineFunc is not readmeSell:\n%s\nwant\n%s", doc, got, want[0])
		}
	}
}

// pipelineFunc returns the first keylanepg.PipelineFunc of text, its
// blanks squeezed.
func pipelineFunc(t *testing.T, name, text string) string {
	t.Helper()
	return funcLiteral(t, name, text, "keylanepg.PipelineFunc(func(")
}

// funcLiteral returns the first function literal of text that starts
// with start, up to its closing "\n})", its blanks squeezed.
func funcLiteral(t *testing.T, name, text, start string) string {
	t.Helper()
	i := strings.Index(text, start)
	if i < 0 {
		t.Fatalf("%s has no %s", name, start)
	}
	j := strings.Index(text[i:], "\n})")
	if j < 0 {
		t.Fatalf("%s: its %s does not end", name, start)
	}
	return strings.Join(strings.Fields(text[i:i+j]), " ")
}

// TestTransactionControlIsRefused: a job whose statements would end or
// reshape keylanepg's transaction (COMMIT, ROLLBACK, a savepoint of its
// own outside tx.Begin, BEGIN...), queued by a PipelineHandler or sent
// through a Handler's tx, is refused before anything is sent: the job
// fails permanently with ErrTxOwned and the group's other jobs commit
// with their outcomes. Failed before: the pipeline's COMMIT committed the
// fence and the jobs before it without their outcomes (a redelivery would
// have applied them again), and the Handler's went to the server.
func TestTransactionControlIsRefused(t *testing.T) {
	for _, kind := range applyKinds {
		t.Run(kind, func(t *testing.T) {
			_, db := startShop(t, 4)
			ctx := context.Background()
			setStock(t, db, "a", 10)
			setStock(t, db, "b", 10)
			sqls := []string{"COMMIT", "  commit", "/* hi */ ROLLBACK", "-- x\nend", "begin", "SAVEPOINT s", "release savepoint keylane_job", "rollback to savepoint keylane_job", "START TRANSACTION", "abort"}
			var jobs []keylane.Job
			for i := range sqls {
				jobs = append(jobs, buy(fmt.Sprintf("a%d", i), "a"), keylane.Job{ID: fmt.Sprintf("x%d", i), Key: "b", Payload: []byte(sqls[i])})
			}
			var out []keylanepg.Outcome
			var err error
			switch kind {
			case "set":
				// A b job's statement goes in Read's batch or, for every
				// other one, in Write's: both are refused.
				out, err = keylanepg.ApplySet(ctx, db, group(0, 1, jobs...), keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
					var sells []keylane.Job
					var late []string
					for i, job := range jobs {
						switch {
						case job.Key != "b":
							sells = append(sells, job)
						case i%4 == 1:
							b.Queue(string(job.Payload))
						default:
							late = append(late, string(job.Payload))
						}
					}
					w, err := shop.SellSet.Read(sells, b)
					if err != nil {
						return nil, err
					}
					return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
						rs, err := w(b)
						if err != nil {
							return nil, err
						}
						for _, sql := range late {
							b.Queue(sql)
						}
						out := make([]keylanepg.SetResult, 0, len(jobs))
						for _, job := range jobs {
							if job.Key == "b" {
								out = append(out, keylanepg.SetResult{})
								continue
							}
							out, rs = append(out, rs[0]), rs[1:]
						}
						return out, nil
					}, nil
				}))
			case "pipeline":
				out, err = keylanepg.ApplyPipeline(ctx, db, group(0, 1, jobs...), keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
					if job.Key == "b" {
						b.Queue(string(job.Payload))
						return nil, nil
					}
					return shop.SellPipeline.Queue(job, b)
				}))
			default:
				out, err = keylanepg.Apply(ctx, db, group(0, 1, jobs...), keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
					if job.Key == "b" {
						_, err := tx.Exec(ctx, string(job.Payload))
						return nil, err
					}
					return shop.Sell.Handle(ctx, tx, job)
				}))
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range out {
				switch {
				case o.Key == "a" && o.Status != keylanepg.Applied:
					t.Errorf("%s: %s %v, want applied", o.JobID, o.Status, o.Err)
				case o.Key == "b" && (o.Status != keylanepg.Failed || !errors.Is(o.Err, keylanepg.ErrTxOwned) || !errors.Is(o.Err, keylane.ErrPermanent)):
					t.Errorf("%s: %s %v, want failed for good with ErrTxOwned", o.JobID, o.Status, o.Err)
				}
			}
			if a := audit(t, db, "a"); a.Orders != int64(len(sqls)) || a.OrdersWithoutOutcome != 0 {
				t.Errorf("sku a: %+v, want %d orders, each with its outcome", a, len(sqls))
			}
		})
	}
}

// TestPipelineFailedRecordCommitsNothing: on a pool the fast path sends
// the outcomes' record and COMMIT in one message; when the record fails
// (here a trigger refuses one job's outcome), the server skips the COMMIT
// and the transaction is rolled back whole: Apply fails saying the record
// failed (not that the commit's fate is unknown), no order row and no
// outcome is left, the pool's connection is good for the next group, and
// applying the group again once the record can be written applies it
// once.
func TestPipelineFailedRecordCommitsNothing(t *testing.T) {
	_, db := startShop(t, 1) // one connection: the next group reuses it
	ctx := context.Background()
	setStock(t, db, "r", 5)
	if _, err := db.Exec(ctx, `CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.job_id = 'boom' THEN RAISE EXCEPTION 'the test refuses boom''s outcome'; END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_boom BEFORE INSERT ON keylane_outcomes FOR EACH ROW EXECUTE FUNCTION refuse_boom()`); err != nil {
		t.Fatal(err)
	}
	g := group(0, 1, buy("r1", "r"), buy("boom", "r"))
	_, err := keylanepg.ApplyPipeline(ctx, db, g, shop.SellPipeline)
	if err == nil || !strings.Contains(err.Error(), "keylanepg: record outcomes: ") || strings.Contains(err.Error(), "fate is unknown") {
		t.Fatalf("ApplyPipeline with a refused record: %v; want the record's error, its fate known", err)
	}
	if a := audit(t, db, "r"); a != (shop.Audit{Stock: 5}) {
		t.Fatalf("after the refused record: %+v, want nothing written", a)
	}
	if _, err := db.Exec(ctx, `DROP TRIGGER refuse_boom ON keylane_outcomes`); err != nil {
		t.Fatal(err) // the connection was given back in a transaction
	}
	out, err := keylanepg.ApplyPipeline(ctx, db, g, shop.SellPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if got := results(out); !slices.Equal(got, []string{"r1 applied sold 4", "boom applied sold 3"}) {
		t.Errorf("applied again: %q", got)
	}
	if a := audit(t, db, "r"); a != (shop.Audit{Stock: 3, Orders: 2, Units: 2}) {
		t.Errorf("applied again: %+v", a)
	}
}
