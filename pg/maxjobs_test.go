package keylanepg_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// TestApplierCapsJobsPerTransaction hands the Applier one group of three
// SKUs' 100 purchases each, as a worker joining hot keys does, with the
// handler writing each job's top-level transaction ID (txid_current()) to
// a table beside its order. No transaction may carry more than
// DefaultMaxJobs jobs (each its savepoint: PostgreSQL's subtransaction
// cache holds 64), every purchase must be applied once, each SKU's in
// order; and a SKU whose job fails retriably in one transaction holds its
// later jobs in the next ones too, while the other SKUs go on. Run for
// every kind of Applier: with Handler, and with Pipeline (whose fast path
// has no savepoint, but whose careful path has, and which must hold a
// failed key's later jobs all the same).
func TestApplierCapsJobsPerTransaction(t *testing.T) {
	forKinds(t, testApplierCapsJobsPerTransaction)
}

func testApplierCapsJobsPerTransaction(t *testing.T, kind string) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE jobtx (job_id text PRIMARY KEY, tx bigint NOT NULL, seq bigserial)`); err != nil {
		t.Fatal(err)
	}
	skus := []string{"a", "b", "c"}
	const perSKU = 100
	var jobs []keylane.Job
	for _, sku := range skus {
		setStock(t, db, sku, perSKU)
		for i := range perSKU {
			jobs = append(jobs, buy(fmt.Sprintf("%s%03d", sku, i), sku))
		}
	}
	failAt := "b070" // in the second transaction of 64; b's later jobs reach the third and fourth
	h := keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		if job.ID == failAt {
			return nil, fmt.Errorf("a retriable failure of %s", job.ID)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO jobtx (job_id, tx) VALUES ($1, txid_current())`, job.ID); err != nil {
			return nil, err
		}
		return shop.Sell.Handle(ctx, tx, job)
	})
	// The pipeline's b070 fails as the handler's does, before any of its
	// statements is sent (Queue's error): the fast path fails it alone
	// and must hold b's later jobs, in this transaction and the next.
	p := keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
		if job.ID == failAt {
			return nil, fmt.Errorf("a retriable failure of %s", job.ID)
		}
		b.Queue(`INSERT INTO jobtx (job_id, tx) VALUES ($1, txid_current())`, job.ID)
		return shop.SellPipeline.Queue(job, b)
	})
	// A set with b070 in it is refused whole by Read: the careful path
	// then fails b070 alone, and holds b's later jobs as the others do.
	s := keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
		ids := make([]string, len(jobs))
		for i, job := range jobs {
			if job.ID == failAt {
				return nil, fmt.Errorf("a retriable failure of %s", job.ID)
			}
			ids[i] = job.ID
		}
		b.Queue(`INSERT INTO jobtx (job_id, tx) SELECT unnest($1::text[]), txid_current()`, ids)
		return shop.SellSet.Read(jobs, b)
	})
	app := &keylanepg.Applier{DB: db, Handler: h}
	switch kind {
	case "pipeline":
		app = &keylanepg.Applier{DB: db, Pipeline: p}
	case "set":
		app = &keylanepg.Applier{DB: db, Set: s}
	}
	out, err := app.ApplyGroup(ctx, keylane.JobGroup{Namespace: ns, Partition: 0, Fence: 1, Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(jobs) {
		t.Fatalf("%d outcomes for %d jobs", len(out), len(jobs))
	}

	rows, err := db.Query(ctx, `SELECT tx, count(*) FROM jobtx GROUP BY tx ORDER BY min(seq)`)
	if err != nil {
		t.Fatal(err)
	}
	perTx, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int64, error) {
		var tx, n int64
		err := r.Scan(&tx, &n)
		return n, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range perTx {
		if n > keylanepg.DefaultMaxJobs {
			t.Errorf("jobs per transaction %v: one carried %d, more than %d", perTx, n, keylanepg.DefaultMaxJobs)
			break
		}
	}

	applied := map[string]int64{}
	for i, j := range jobs {
		o := out[i]
		heldB := j.Key == "b" && j.ID >= failAt
		switch {
		case j.ID == failAt:
			if o.Done || o.Err == nil {
				t.Errorf("job %s: %+v, want failed", j.ID, o)
			}
		case heldB:
			if o.Done || o.Err != nil {
				t.Errorf("job %s after %s's failure: %+v, want held", j.ID, failAt, o)
			}
		default:
			if !o.Done {
				t.Errorf("job %s: %+v, want done", j.ID, o)
			}
			applied[j.Key]++
		}
	}
	// Each SKU's jobs ran in order: their rows' sequence follows the IDs.
	rows, err = db.Query(ctx, `SELECT job_id FROM jobtx ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ran, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	for _, id := range ran {
		if k := id[:1]; last[k] >= id {
			t.Errorf("job %s ran after %s", id, last[k])
		} else {
			last[k] = id
		}
	}
	for _, sku := range skus {
		want := shop.Audit{Stock: perSKU - applied[sku], Orders: applied[sku], Units: applied[sku]}
		if a := audit(t, db, sku); a != want {
			t.Errorf("sku %s: %+v, want %+v", sku, a, want)
		}
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes`); n != int64(len(ran)) {
		t.Errorf("%d outcomes recorded for %d jobs applied", n, len(ran))
	}
}
