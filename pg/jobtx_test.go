package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
)

// TestEveryKindOfFirstStatement has each job of a group open with a
// different kind of statement, after a job that wrote (the savepoint roll
// rides on the first statement, or goes alone before those that cannot
// carry it), then fail or not: every applied job's row is there, every
// failed job's row is not, and a job that fails before any statement
// leaves the job before it applied.
func TestEveryKindOfFirstStatement(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE marks (job text PRIMARY KEY, n int)`); err != nil {
		t.Fatal(err)
	}
	mark := func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `INSERT INTO marks VALUES ($1, 1)`, id)
		return err
	}
	first := map[string]func(ctx context.Context, tx pgx.Tx) error{
		"exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT $1::int`, 1)
			return err
		},
		"exec-noargs": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1; SELECT 2`)
			return err
		},
		"query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, $1::int)`, 3)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() { // no Close: rows end themselves
				n++
			}
			if n != 3 {
				return fmt.Errorf("%d rows", n)
			}
			return rows.Err()
		},
		"collect": func(ctx context.Context, tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, `SELECT generate_series(1, $1::int)`, 2)
			got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err == nil && len(got) != 2 {
				err = fmt.Errorf("%v", got)
			}
			return err
		},
		"queryrow": func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, `SELECT $1::int`, 5).Scan(&n)
		},
		"queryrow-none": func(ctx context.Context, tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT 1 WHERE $1::int = 0`, 5).Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("no row: %v", err)
			}
			return nil
		},
		"batch": func(ctx context.Context, tx pgx.Tx) error {
			var b pgx.Batch
			b.Queue(`SELECT 1`)
			return tx.SendBatch(ctx, &b).Close()
		},
		"nested": func(ctx context.Context, tx pgx.Tx) error {
			sub, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sub.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			return sub.Commit(ctx)
		},
		"sql-error": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1 / $1::int`, 0)
			return err
		},
		"none": func(context.Context, pgx.Tx) error { return nil },
	}
	h := keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		kind, fail := string(job.Payload), false
		if len(kind) > 5 && kind[:5] == "fail-" {
			kind, fail = kind[5:], true
		}
		if err := first[kind](ctx, tx); err != nil {
			return nil, keylane.Permanent(err)
		}
		if fail {
			return nil, keylane.Permanent(errFlaky)
		}
		return nil, mark(ctx, tx, job.ID)
	})
	var jobs []keylane.Job
	want := map[string]bool{}
	for kind := range first {
		for _, fail := range []bool{false, true} {
			payload := kind
			if fail {
				payload = "fail-" + kind
			}
			// A writing job before each, so its writes sit in the
			// savepoint the job rolls on from.
			jobs = append(jobs, keylane.Job{ID: "before-" + payload, Key: "k", Payload: []byte("exec")},
				keylane.Job{ID: payload, Key: "k", Payload: []byte(payload)})
			want["before-"+payload] = true
			want[payload] = !fail && kind != "sql-error"
		}
	}
	out, err := keylanepg.Apply(ctx, db, group(0, 1, jobs...), h)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Done() != want[o.JobID] {
			t.Errorf("%s: %s %v, want done=%v", o.JobID, o.Status, o.Err, want[o.JobID])
		}
		n := rowCount(t, db, `SELECT count(*) FROM marks WHERE job = $1`, o.JobID)
		if (n == 1) != want[o.JobID] {
			t.Errorf("%s: %d rows, want applied=%v", o.JobID, n, want[o.JobID])
		}
	}
}
