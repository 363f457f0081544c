// Package shop is keylanepg's example: a shop whose stock and orders live
// in PostgreSQL, sold through keylane jobs keyed by SKU. Sell applies the
// inventory package's commands (buy N, set N, get) to the tables stock and
// orders, with inventory's result texts, so a sale that runs against
// keylane's own state runs against the database unchanged.
package shop

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/inventory"
	"github.com/keylane/keylane/pg"
)

// Schema is the shop's tables: a SKU's stock (never below zero), and one
// order row per applied purchase, naming the job that made it.
const Schema = `
CREATE TABLE IF NOT EXISTS stock (
	sku text PRIMARY KEY,
	n bigint NOT NULL CHECK (n >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
	id bigserial PRIMARY KEY,
	sku text NOT NULL,
	qty bigint NOT NULL DEFAULT 1,
	job_id text NOT NULL UNIQUE,
	at timestamptz NOT NULL DEFAULT now()
);
`

// Sell applies one inventory command to the SKU job.Key, in the group's
// transaction:
//
//	buy N   sells N units if that many are left: the stock row goes down
//	        by N and one order row is inserted -> "sold <left>"; else
//	        nothing is written -> "soldout <left>" (a result, not a
//	        failure: the buyer is answered, the job is done)
//	set N   sets the stock -> "ok N"
//	get     reads it -> "stock N"
//
// Anything else is a permanent error. A SKU without a stock row has none.
var Sell keylanepg.Handler = keylanepg.HandlerFunc(sell)

func sell(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	cmd, err := inventory.Parse(job.Payload)
	if err != nil {
		return nil, keylane.Permanent(err)
	}
	switch cmd.Op {
	case "buy":
		left, sold, err := Buy(ctx, tx, job.Key, job.ID, cmd.N)
		if err != nil {
			return nil, err
		}
		if !sold {
			return []byte("soldout " + strconv.FormatInt(left, 10)), nil
		}
		return []byte("sold " + strconv.FormatInt(left, 10)), nil
	case "set":
		if _, err := tx.Exec(ctx, `INSERT INTO stock (sku, n) VALUES ($1, $2) ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n`, job.Key, cmd.N); err != nil {
			return nil, err
		}
		return []byte("ok " + strconv.FormatInt(cmd.N, 10)), nil
	case "get":
		n, err := stock(ctx, tx, job.Key)
		if err != nil {
			return nil, err
		}
		return []byte("stock " + strconv.FormatInt(n, 10)), nil
	}
	return nil, keylane.Permanent(fmt.Errorf("%w: %s is not for the shop", inventory.ErrBadCommand, cmd.Op))
}

// Buy sells qty units of sku for job jobID if that many are left, and
// returns the stock left and whether it sold. It is the sale's one
// conditional UPDATE and one INSERT; keylane has serialized the SKU's jobs,
// so no row lock waits.
func Buy(ctx context.Context, tx pgx.Tx, sku, jobID string, qty int64) (left int64, sold bool, err error) {
	err = tx.QueryRow(ctx, `UPDATE stock SET n = n - $2 WHERE sku = $1 AND n >= $2 RETURNING n`, sku, qty).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		left, err = stock(ctx, tx, sku)
		return left, false, err
	}
	if err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (sku, qty, job_id) VALUES ($1, $2, $3)`, sku, qty, jobID); err != nil {
		return 0, false, err
	}
	return left, true, nil
}

func stock(ctx context.Context, tx pgx.Tx, sku string) (int64, error) {
	var n int64
	err := tx.QueryRow(ctx, `SELECT n FROM stock WHERE sku = $1`, sku).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

// BuyRequest and BuyResponse are SellJSON's request and response.
type BuyRequest struct {
	Qty int64 `json:"qty"`
}

// BuyResponse tells whether the units were sold, and what is left.
type BuyResponse struct {
	Sold bool  `json:"sold"`
	Left int64 `json:"left"`
}

// SellJSON is Sell's buy in JSON: {"qty":N} -> {"sold":true,"left":L}.
var SellJSON = keylanepg.JSONHandler(func(ctx context.Context, tx pgx.Tx, job keylane.Job, req BuyRequest) (BuyResponse, error) {
	if req.Qty <= 0 {
		return BuyResponse{}, keylane.Permanent(fmt.Errorf("shop: qty %d is not a quantity", req.Qty))
	}
	left, sold, err := Buy(ctx, tx, job.Key, job.ID, req.Qty)
	return BuyResponse{Sold: sold, Left: left}, err
})
