package keylanepg_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// Poison jobs: a job whose own statement cannot be sent or run, in a
// group with jobs that can. Each must fail alone (its Err set, not Done)
// and the group's other jobs commit; the call itself must not fail. A
// call that failed whole was retried by the worker for ever without
// counting (issue 30, faults 2 and 3).

// poisonSchema is a table with a deferred foreign key: a job that breaks
// it passes every statement and is refused at COMMIT.
const poisonSchema = `
CREATE TABLE IF NOT EXISTS parent (id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS child (id text PRIMARY KEY,
	pid text NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);`

// poisons are the ways a job poisons its group, by payload; what every
// kind sends for each is in poisonHandler, poisonPipeline and poisonSet.
// permanent: the job's failure must be for good (no retry encodes a value
// that does not fit); ok: the job must succeed (a valid pgx option).
var poisons = []struct {
	payload   string
	permanent bool
	ok        bool
}{
	// A Go uint64 above the largest bigint: pgx cannot encode it.
	{payload: "poison encode-first", permanent: true},
	{payload: "poison encode-later", permanent: true},
	// A statement the server will not prepare (42703, undefined column).
	{payload: "poison prepare"},
	// A deferred foreign key broken: the server refuses it at COMMIT.
	{payload: "poison deferred"},
	// A valid pgx option as the first argument: the job succeeds.
	{payload: "poison option", ok: true},
}

var bigUint = uint64(math.MaxUint64)

// poisonStatements are a poison job's statements, in order, as (sql,
// args) pairs.
func poisonStatements(job keylane.Job) [][]any {
	switch strings.TrimPrefix(string(job.Payload), "poison ") {
	case "encode-first":
		return [][]any{{"SELECT $1::bigint", bigUint}}
	case "encode-later":
		return [][]any{{"SELECT $1::int", 1}, {"SELECT $1::int", 2}, {"SELECT $1::bigint", bigUint}}
	case "prepare":
		return [][]any{{"SELECT nosuchcolumn FROM stock WHERE sku = $1", job.Key}}
	case "deferred":
		return [][]any{{"INSERT INTO child (id, pid) VALUES ($1, 'no such parent')", job.ID}}
	case "option":
		return [][]any{{"SELECT $1::int", pgx.QueryResultFormats{pgx.TextFormatCode}, 1}}
	}
	panic("unknown poison " + string(job.Payload))
}

func isPoison(job keylane.Job) bool { return strings.HasPrefix(string(job.Payload), "poison ") }

var poisonHandler = keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	if !isPoison(job) {
		return shop.Sell.Handle(ctx, tx, job)
	}
	for _, st := range poisonStatements(job) {
		if _, ok := st[1].(pgx.QueryResultFormats); ok {
			// An option of Query (pgx's Exec has none such).
			rows, err := tx.Query(ctx, st[0].(string), st[1:]...)
			if err != nil {
				return nil, err
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, err
			}
			continue
		}
		if _, err := tx.Exec(ctx, st[0].(string), st[1:]...); err != nil {
			return nil, err
		}
	}
	return []byte("poison ran"), nil
})

var poisonPipeline = keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
	if !isPoison(job) {
		return shop.SellPipeline.Queue(job, b)
	}
	for _, st := range poisonStatements(job) {
		if _, ok := st[1].(pgx.QueryResultFormats); ok {
			continue // an option of a call, not of a batch: the pipeline has none
		}
		b.Queue(st[0].(string), st[1:]...)
	}
	return func() ([]byte, error) { return []byte("poison ran"), nil }, nil
})

var poisonSet = keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
	var good []keylane.Job
	for _, job := range jobs {
		if !isPoison(job) {
			good = append(good, job)
			continue
		}
		for _, st := range poisonStatements(job) {
			if _, ok := st[1].(pgx.QueryResultFormats); ok {
				continue
			}
			b.Queue(st[0].(string), st[1:]...)
		}
	}
	var w keylanepg.Write
	if len(good) > 0 {
		var err error
		if w, err = shop.SellSet.Read(good, b); err != nil {
			return nil, err
		}
	}
	return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
		var rs []keylanepg.SetResult
		if w != nil {
			var err error
			if rs, err = w(b); err != nil {
				return nil, err
			}
		}
		out := make([]keylanepg.SetResult, len(jobs))
		k := 0
		for i, job := range jobs {
			if isPoison(job) {
				out[i] = keylanepg.SetResult{Result: []byte("poison ran")}
				continue
			}
			out[i] = rs[k]
			k++
		}
		return out, nil
	}, nil
})

func poisonApplier(kind string, db keylanepg.DB) *keylanepg.Applier {
	switch kind {
	case "pipeline":
		return &keylanepg.Applier{DB: db, Pipeline: poisonPipeline}
	case "set":
		return &keylanepg.Applier{DB: db, Set: poisonSet}
	}
	return &keylanepg.Applier{DB: db, Handler: poisonHandler}
}

// TestPoisonJobFailsAlone applies, for every kind and every poison, a
// group of a purchase, the poison job, and two more purchases (the poison
// not first, so a Handler's first statement rides with its savepoint).
// The purchases must commit, the poison fail alone (for good where no
// retry can cure it), and the call must not fail. On main every poison
// but the option failed the whole call, and the deferred key's was said
// to be of unknown fate.
func TestPoisonJobFailsAlone(t *testing.T) {
	_, db := startShop(t, 8)
	ctx := context.Background()
	if _, err := db.Exec(ctx, poisonSchema); err != nil {
		t.Fatal(err)
	}
	fence := uint64(1)
	for _, kind := range applyKinds {
		for _, p := range poisons {
			t.Run(kind+"/"+strings.TrimPrefix(p.payload, "poison "), func(t *testing.T) {
				run := kind + "-" + strings.TrimPrefix(p.payload, "poison ")
				for _, sku := range []string{"a", "b", "c"} {
					setStock(t, db, sku, 10)
				}
				g := keylane.JobGroup{Namespace: ns, Partition: 0, Fence: fence, Jobs: []keylane.Job{
					buy(run+"-1", "a"),
					{ID: run + "-poison", Key: "p", Payload: []byte(p.payload)},
					buy(run+"-2", "b"),
					buy(run+"-3", "c"),
				}}
				fence++
				out, err := poisonApplier(kind, db).ApplyGroup(ctx, g)
				if err != nil {
					t.Fatalf("the group failed whole: %v", err)
				}
				for i, o := range out {
					job := g.Jobs[i]
					switch {
					case !isPoison(job) || p.ok:
						if !o.Done {
							t.Errorf("job %s: not done (err %v)", job.ID, o.Err)
						}
					case o.Done || o.Err == nil:
						t.Errorf("poison job %s: done %v, err %v: want it failed", job.ID, o.Done, o.Err)
					case p.permanent && !errors.Is(o.Err, keylane.ErrPermanent):
						t.Errorf("poison job %s failed with %v, want a permanent failure", job.ID, o.Err)
					default:
						t.Logf("poison job %s failed alone: %v", job.ID, o.Err)
					}
				}
				for _, sku := range []string{"a", "b", "c"} {
					if a := audit(t, db, sku); a.Orders != 1 {
						t.Errorf("sku %s: %d order rows, want 1", sku, a.Orders)
					}
				}
				if n := rowCount(t, db, `SELECT count(*) FROM child`); n != 0 {
					t.Errorf("%d child rows committed, want none", n)
				}
				if _, err := db.Exec(ctx, `TRUNCATE orders`); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
