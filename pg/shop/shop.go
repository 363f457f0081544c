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
		if _, err := tx.Exec(ctx, setSQL, job.Key, cmd.N); err != nil {
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
	err := noRowIsZero(tx.QueryRow(ctx, stockSQL, sku).Scan(&n))
	return n, err
}

// SellPipeline is Sell as a keylanepg.PipelineHandler: the same commands,
// results and rows, each a single statement queued with the group's
// others, so a transaction of many purchases costs two round trips (on a
// pool; see keylanepg's "Pipelined handlers"), not two per purchase. A buy is one statement (QueueBuy).
var SellPipeline keylanepg.PipelineHandler = keylanepg.PipelineFunc(sellPipeline)

func sellPipeline(job keylane.Job, b *pgx.Batch) (keylanepg.Result, error) {
	cmd, err := inventory.Parse(job.Payload)
	if err != nil {
		return nil, keylane.Permanent(err)
	}
	switch cmd.Op {
	case "buy":
		bought := QueueBuy(b, job.Key, job.ID, cmd.N)
		return func() ([]byte, error) {
			left, sold := bought()
			if !sold {
				return []byte("soldout " + strconv.FormatInt(left, 10)), nil
			}
			return []byte("sold " + strconv.FormatInt(left, 10)), nil
		}, nil
	case "set":
		b.Queue(setSQL, job.Key, cmd.N)
		return func() ([]byte, error) { return []byte("ok " + strconv.FormatInt(cmd.N, 10)), nil }, nil
	case "get":
		var n int64
		b.Queue(stockSQL, job.Key).QueryRow(func(row pgx.Row) error { return noRowIsZero(row.Scan(&n)) })
		return func() ([]byte, error) { return []byte("stock " + strconv.FormatInt(n, 10)), nil }, nil
	}
	return nil, keylane.Permanent(fmt.Errorf("%w: %s is not for the shop", inventory.ErrBadCommand, cmd.Op))
}

// buySQL is Buy in one statement: the conditional UPDATE, the order row
// when it sold, and the stock left either way (none without a stock row).
const buySQL = `WITH u AS (UPDATE stock SET n = n - $2::bigint WHERE sku = $1::text AND n >= $2::bigint RETURNING n),
o AS (INSERT INTO orders (sku, qty, job_id) SELECT $1::text, $2::bigint, $3::text FROM u)
SELECT n, true FROM u
UNION ALL
SELECT n, false FROM stock WHERE sku = $1::text AND NOT EXISTS (SELECT FROM u)`

const (
	setSQL   = `INSERT INTO stock (sku, n) VALUES ($1, $2) ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n`
	stockSQL = `SELECT n FROM stock WHERE sku = $1`
)

// QueueBuy queues Buy's sale of qty units of sku for job jobID as one
// statement on b, for a PipelineHandler; the function it returns tells,
// once b ran, the stock left and whether it sold.
func QueueBuy(b *pgx.Batch, sku, jobID string, qty int64) func() (left int64, sold bool) {
	var (
		left int64
		sold bool
	)
	b.Queue(buySQL, sku, qty, jobID).QueryRow(func(row pgx.Row) error {
		return noRowIsZero(row.Scan(&left, &sold))
	})
	return func() (int64, bool) { return left, sold }
}

// noRowIsZero reads a SKU without a stock row as none left.
func noRowIsZero(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
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

// SellJSONPipeline is SellJSON as a keylanepg.PipelineHandler.
var SellJSONPipeline = keylanepg.JSONPipeline(func(job keylane.Job, req BuyRequest, b *pgx.Batch) (func() (BuyResponse, error), error) {
	if req.Qty <= 0 {
		return nil, keylane.Permanent(fmt.Errorf("shop: qty %d is not a quantity", req.Qty))
	}
	bought := QueueBuy(b, job.Key, job.ID, req.Qty)
	return func() (BuyResponse, error) {
		left, sold := bought()
		return BuyResponse{Sold: sold, Left: left}, nil
	}, nil
})
