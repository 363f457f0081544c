package keylanepg_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
)

// A Handler that sells one unit of the SKU job.Key, answering "sold out"
// as a result, and the Apply of a group of two SKUs' jobs, as a worker
// owning partition 3 under fence 7 would run it. (Compiled, not run: it
// needs a database; the package's tests run the same against a real one.)
func ExampleApply() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://shop@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := keylanepg.Ensure(ctx, pool); err != nil {
		log.Fatal(err) // e.g. a SchemaError naming the GRANT to run
	}
	sell := keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		tag, err := tx.Exec(ctx, `UPDATE stock SET n = n - 1 WHERE sku = $1 AND n > 0`, job.Key)
		if err != nil {
			return nil, err // rolled back alone, retried
		}
		if tag.RowsAffected() == 0 {
			return []byte("sold out"), nil // an answer, recorded like a sale
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (sku, job_id) VALUES ($1, $2)`, job.Key, job.ID); err != nil {
			return nil, err
		}
		return []byte("sold"), nil
	})
	out, err := keylanepg.Apply(ctx, pool, keylanepg.Group{
		Namespace: "shop", Partition: 3, Fence: 7,
		Jobs: []keylane.Job{
			{ID: "order-1", Key: "sku-a"},
			{ID: "order-2", Key: "sku-b"},
			{ID: "order-3", Key: "sku-a"},
		},
	}, sell, keylanepg.IdleTimeout(keylane.DefaultLeaseTTL/2))
	if err != nil {
		log.Fatal(err) // a StaleFenceError, or a failed or unknown commit: no reply, no ack
	}
	for _, o := range out {
		fmt.Println(o.JobID, o.Status, string(o.Result)) // reply and ack the Done ones
	}
}

// readmeSell is the README's PipelineHandler ("keylane in front of your
// database"): the sale as one statement, queued with the group's others.
// TestREADMEPipelineSell runs it against a real database.
var readmeSell = keylanepg.PipelineFunc(func(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
	var sold bool
	b.Queue(`WITH u AS (UPDATE stock SET n = n - 1 WHERE sku = $1 AND n > 0 RETURNING sku)
		INSERT INTO orders (sku, job_id) SELECT sku, $2 FROM u`, job.Key, job.ID).
		Exec(func(tag pgconn.CommandTag) error { sold = tag.RowsAffected() == 1; return nil })
	return func() ([]byte, error) {
		if !sold {
			return []byte("soldout"), nil
		}
		return []byte("sold"), nil
	}, nil
})

// readmeSetSell is the README's SetHandler: the same sale, a
// transaction's jobs read and written together, two statements for all
// their writes. TestREADMESetSell runs it against a real database.
var readmeSetSell = keylanepg.SetFunc(func(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
	skus := make([]string, len(jobs))
	for i, job := range jobs {
		skus[i] = job.Key
	}
	stock := map[string]int64{}
	b.Queue(`SELECT sku, n FROM stock WHERE sku = ANY($1) FOR UPDATE`, skus).Query(func(rows pgx.Rows) error {
		var sku string
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&sku, &n}, func() error { stock[sku] = n; return nil })
		return err
	})
	return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
		res := make([]keylanepg.SetResult, len(jobs))
		var sold, ids []string
		for i, job := range jobs {
			if stock[job.Key] == 0 {
				res[i].Result = []byte("soldout")
				continue
			}
			stock[job.Key]--
			sold, ids = append(sold, job.Key), append(ids, job.ID)
			res[i].Result = []byte("sold")
		}
		b.Queue(`UPDATE stock SET n = n - s.c FROM (SELECT sku, count(*) AS c FROM unnest($1::text[]) AS sku GROUP BY sku) s
			WHERE stock.sku = s.sku`, sold)
		b.Queue(`INSERT INTO orders (sku, job_id) SELECT * FROM unnest($1::text[], $2::text[])`, sold, ids)
		return res, nil
	}, nil
})

// A PipelineHandler: the same sale, its statements sent with the group's
// others in one round trip (three a transaction, whatever its jobs).
// (Compiled, not run: TestREADMEPipelineSell runs readmeSell.)
func ExampleApplyPipeline() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://shop@127.0.0.1:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	out, err := keylanepg.ApplyPipeline(ctx, pool, keylanepg.Group{
		Namespace: "shop", Partition: 3, Fence: 7,
		Jobs: []keylane.Job{{ID: "order-1", Key: "sku-a"}, {ID: "order-2", Key: "sku-a"}},
	}, readmeSell)
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range out {
		fmt.Println(o.JobID, o.Status, string(o.Result))
	}
}
