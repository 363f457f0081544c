package shop

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Audit is what the database holds of a SKU's sale through Sell, for a
// verdict that checks the database's own rows. A clean sale from a start
// stock S has Stock = S - Units, and both counts of unmatched rows zero.
type Audit struct {
	Stock  int64 // the stock row's n (0 without a row)
	Orders int64 // order rows
	Units  int64 // units those orders sold
	// OrdersWithoutOutcome counts order rows whose job has no recorded
	// outcome: applied without its outcome, which keylanepg's one
	// transaction rules out.
	OrdersWithoutOutcome int64
	// SoldWithoutOrder counts "sold" outcomes with no order row: recorded
	// without their rows.
	SoldWithoutOrder int64
}

// Querier is what AuditSKU needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AuditSKU reads sku's Audit, for the jobs of namespace, in one statement
// (one snapshot).
func AuditSKU(ctx context.Context, q Querier, namespace, sku string) (Audit, error) {
	var a Audit
	err := q.QueryRow(ctx, `SELECT
	coalesce((SELECT n FROM stock WHERE sku = $2), 0),
	(SELECT count(*) FROM orders WHERE sku = $2),
	(SELECT coalesce(sum(qty), 0) FROM orders WHERE sku = $2),
	(SELECT count(*) FROM orders o WHERE o.sku = $2 AND NOT EXISTS
		(SELECT 1 FROM keylane_outcomes k WHERE k.namespace = $1 AND k.job_id = o.job_id)),
	(SELECT count(*) FROM keylane_outcomes k WHERE k.namespace = $1 AND k.key = $2
		AND position('sold '::bytea in k.result) = 1
		AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.job_id = k.job_id))`,
		namespace, sku).Scan(&a.Stock, &a.Orders, &a.Units, &a.OrdersWithoutOutcome, &a.SoldWithoutOrder)
	if err != nil {
		return a, fmt.Errorf("shop: audit %s: %w", sku, err)
	}
	return a, nil
}
