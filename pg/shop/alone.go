package shop

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The same sale with PostgreSQL alone, each purchase its own transaction
// from one of many clients: the peers keylane in front of the database is
// measured against (pg's BenchmarkSale, the bench module's rows).

// Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Beginner begins a transaction: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// BuyConditional sells one unit of sku with one conditional UPDATE in a
// transaction of its own, and no order row: the least a purchase costs
// PostgreSQL, every buyer of a hot SKU waiting on its row lock.
func BuyConditional(ctx context.Context, db Execer, sku string) (sold bool, err error) {
	tag, err := db.Exec(ctx, `UPDATE stock SET n = n - 1 WHERE sku = $1 AND n > 0`, sku)
	if err != nil {
		return false, fmt.Errorf("shop: buy %s: %w", sku, err)
	}
	return tag.RowsAffected() == 1, nil
}

// BuyForUpdate sells one unit of sku as a shop usually does without
// keylane: BEGIN; SELECT … FOR UPDATE; UPDATE; INSERT the order for
// orderID; COMMIT. A sold-out SKU commits nothing.
func BuyForUpdate(ctx context.Context, db Beginner, sku, orderID string) (sold bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT n FROM stock WHERE sku = $1 FOR UPDATE`, sku).Scan(&n); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		}
		if n <= 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE stock SET n = n - 1 WHERE sku = $1`, sku); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (sku, job_id) VALUES ($1, $2)`, sku, orderID); err != nil {
			return err
		}
		sold = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("shop: buy %s: %w", sku, err)
	}
	return sold, nil
}

// SetStock sets the stock of every SKU of skus to n, in one statement.
func SetStock(ctx context.Context, db Execer, skus []string, n int64) error {
	_, err := db.Exec(ctx, `INSERT INTO stock (sku, n) SELECT unnest($1::text[]), $2
ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n`, skus, n)
	if err != nil {
		return fmt.Errorf("shop: set stock: %w", err)
	}
	return nil
}

// Levels reads the stock of every SKU of skus, in their order (0 for a SKU
// without a row), in one statement.
func Levels(ctx context.Context, db Querier, skus []string) ([]int64, error) {
	var out []int64
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(coalesce(s.n, 0) ORDER BY u.i), '{}')
FROM unnest($1::text[]) WITH ORDINALITY AS u(sku, i) LEFT JOIN stock s ON s.sku = u.sku`, skus).Scan(&out)
	if err != nil {
		return nil, fmt.Errorf("shop: read stock: %w", err)
	}
	return out, nil
}
