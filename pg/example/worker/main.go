// Command worker is the complete Go worker of docs/database.md: a
// keylane worker that sells from PostgreSQL, one JSON purchase a job,
// through keylanepg. Run it beside NATS and PostgreSQL:
//
//	NATS_URL=nats://127.0.0.1:4222 DATABASE_URL=postgres://shop@127.0.0.1/shop go run .
//
// and call it with the job type "buy", the SKU as the key, {"qty": N} as
// the payload and the order ID as the job's ID; it answers
// {"sold": true, "left": L}. Its test runs it against a real nats-server
// and PostgreSQL, and checks that docs/database.md shows this file as it
// is.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/nats-io/nats.go"
)

// schema is the shop's tables: a SKU's stock, never below zero, and one
// order row per purchase sold, under the caller's order ID (the job's ID).
const schema = `
CREATE TABLE IF NOT EXISTS stock (
	sku text PRIMARY KEY,
	n bigint NOT NULL CHECK (n >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
	order_id text PRIMARY KEY,
	sku text NOT NULL,
	qty bigint NOT NULL CHECK (qty > 0),
	at timestamptz NOT NULL DEFAULT now()
);`

// buySQL sells qty units of a SKU if that many are left, and inserts the
// order; it returns whether it sold and the stock left, in one statement.
const buySQL = `WITH u AS (UPDATE stock SET n = n - $2 WHERE sku = $1 AND n >= $2 RETURNING n),
o AS (INSERT INTO orders (order_id, sku, qty) SELECT $3, $1, $2 FROM u)
SELECT EXISTS (SELECT FROM u), coalesce((SELECT n FROM u), (SELECT n FROM stock WHERE sku = $1), 0)`

type buy struct {
	Qty int64 `json:"qty"`
}

type bought struct {
	Sold bool  `json:"sold"`
	Left int64 `json:"left"`
}

// sell is the job type "buy" as a pipeline: one statement a purchase,
// every purchase of a transaction in one round trip.
var sell = keylanepg.JSONPipeline(func(job keylane.Job, req buy, b *pgx.Batch) (func() (bought, error), error) {
	if job.Type != "buy" {
		return nil, keylane.Permanent(fmt.Errorf("job type %q: this worker sells (type buy)", job.Type))
	}
	if req.Qty <= 0 {
		return nil, keylane.Permanent(fmt.Errorf("qty %d: buy one or more", req.Qty))
	}
	var r bought
	b.Queue(buySQL, job.Key, req.Qty, job.ID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&r.Sold, &r.Left)
	})
	return func() (bought, error) { return r, nil }, nil
})

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("NATS_URL"), os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// run runs the worker until ctx ends, then drains it.
func run(ctx context.Context, natsURL, databaseURL string) error {
	if natsURL == "" || databaseURL == "" {
		return errors.New("set NATS_URL and DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	if err := keylanepg.Ensure(ctx, pool); err != nil { // keylane_fences, keylane_outcomes
		return err
	}
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "shop", Partitions: 4},
		Applier: &keylanepg.Applier{
			DB:          pool,
			Pipeline:    sell,
			IdleTimeout: keylane.DefaultLeaseTTL / 2, // below the lease TTL
		},
		Logger: slog.Default(),
	})
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-w.Done(): // stopped on its own: say why
		return w.Err()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return w.Stop(sctx)
}
