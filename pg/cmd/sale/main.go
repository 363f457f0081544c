// Command sale runs the flash sale of `submit sale` with the stock and the
// orders in PostgreSQL: an embedded NATS server and workers in this
// process, each applying a SKU's queued purchases in one transaction
// through keylanepg (WorkerConfig.Applier): with shop.SellSet, a
// transaction's reads in one round trip and its writes, a few statements
// for all its jobs, in the next (--handler set, the default); with
// shop.SellPipeline, a statement a job, all in one round trip (--handler
// pipeline); or with shop.Sell, a round trip per statement (--handler
// handler). It prints submit
// sale's verdict lines, then checks them against the database's own rows:
// per SKU, stock = start − sold, one order row per purchase a buyer was
// told "sold", none extra, every order with its recorded outcome.
//
//	go run -C pg ./cmd/sale --postgres local                 # a throwaway server (initdb in a temp dir)
//	go run -C pg ./cmd/sale --postgres postgres://u@host/db  # your database: creates keylane's tables and stock, orders
//
// It is its own command, in the pg module, because keylane's module (and
// cmd/submit) must not depend on pgx.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
	"github.com/keylane/keylane/pg/shop"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var code exitCode
	switch {
	case errors.As(err, &code):
		os.Exit(int(code))
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "sale:", err)
		os.Exit(1)
	}
}

type exitCode int

func (c exitCode) Error() string { return "exit " + strconv.Itoa(int(c)) }

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("sale", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var cfg sale.Config
	pgURL := fs.String("postgres", os.Getenv("DATABASE_URL"), `PostgreSQL URL (env DATABASE_URL), or "local" for a throwaway server started here (initdb in a temporary directory; needs postgres's binaries, as Debian's postgresql package has)`)
	namespace := fs.String("namespace", "shop", "keylane namespace (its fences and outcomes in the database are kept per namespace)")
	workers := fs.Int("workers", 3, "in-process workers")
	partitions := fs.Int("partitions", 0, "partitions (0: 16)")
	conns := fs.Int("conns", 0, "the workers' pool of database connections (0: workers × 8)")
	idle := fs.Duration("idle-timeout", 5*time.Second, "keylanepg.Applier's IdleTimeout: a paused owner's transaction is ended after this (below the lease TTL, 10s)")
	handler := fs.String("handler", "set", "sell with shop.SellSet (set: a SetHandler, a transaction's reads in one round trip, its writes in a few statements for all its jobs in the next), shop.SellPipeline (pipeline: a PipelineHandler, a statement a job, all in one round trip) or shop.Sell (handler: a Handler, a round trip per statement)")
	verbose := fs.Bool("v", false, "log worker events to stderr")
	fs.IntVar(&cfg.SKUs, "skus", 5, "SKUs on sale")
	fs.Int64Var(&cfg.Stock, "stock", 1000, "starting stock of each SKU")
	fs.IntVar(&cfg.Buyers, "buyers", 64, "concurrent buyers")
	fs.IntVar(&cfg.Purchases, "purchases", 10000, "single-unit purchases in all")
	fs.Float64Var(&cfg.Skew, "skew", 1.1, "zipf exponent of demand over SKUs (>1), 0 for even demand")
	fs.BoolVar(&cfg.FireAndForget, "fire-and-forget", false, "submit all purchases with SubmitMany, then wait for the stock")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound on the whole sale")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *pgURL == "" {
		return errors.New(`--postgres URL (or DATABASE_URL) is required; --postgres local starts a throwaway server`)
	}
	if cfg.Skew == 0 {
		cfg.Even = true
	} else if cfg.Skew <= 1 {
		return errors.New("--skew must be above 1, or 0 for even demand")
	}

	url, where := *pgURL, *pgURL
	if url == "local" {
		dir, err := os.MkdirTemp("", "keylane-pg-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := pgtest.New(dir)
		if err != nil {
			return fmt.Errorf("start a local postgres: %w", err)
		}
		defer srv.Stop()
		url = srv.URL("postgres", "postgres")
		where = fmt.Sprintf("a throwaway local server (port %d, removed at exit)", srv.Port)
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("--postgres: %w", err)
	}
	pcfg.MaxConns = int32(*conns)
	if pcfg.MaxConns == 0 {
		pcfg.MaxConns = int32(*workers * 8)
	}
	db, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := keylanepg.Ensure(ctx, db); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, shop.Schema); err != nil {
		return fmt.Errorf("create the shop's tables: %w", err)
	}
	var sync string
	_ = db.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync)

	tr := sale.NewTracker(nil, "")
	var (
		app  keylane.GroupApplier
		kind string
	)
	switch *handler {
	case "set":
		app = trackedGroups{app: &keylanepg.Applier{DB: db, Set: shop.SellSet, IdleTimeout: *idle}, tr: tr}
		kind = "shop.SellSet, a transaction's reads in one round trip and its writes in the next"
	case "pipeline":
		app = trackedGroups{app: &keylanepg.Applier{DB: db, Pipeline: shop.SellPipeline, IdleTimeout: *idle}, tr: tr}
		kind = "shop.SellPipeline, a transaction's statements in one round trip"
	case "handler":
		app = &keylanepg.Applier{DB: db, Handler: tracked(shop.Sell, tr), IdleTimeout: *idle}
		kind = "shop.Sell, a round trip per statement"
	default:
		return fmt.Errorf("--handler %q: want set, pipeline or handler", *handler)
	}
	var log *slog.Logger
	if *verbose {
		log = slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	local, err := sale.StartLocal(ctx, sale.LocalConfig{
		Workers:  *workers,
		Topology: keylane.TopologyConfig{Namespace: *namespace, Partitions: *partitions},
		Applier:  app,
		Tracker:  tr,
		Logger:   log,
	})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		local.Stop(sctx)
	}()
	cl, err := local.Client(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintf(out, "keylane: embedded NATS at %s, %d workers in this process, %d partitions\n", local.URL, len(local.Workers), cl.Partitions())
	fmt.Fprintf(out, "postgres: %s, synchronous_commit=%s; each key's queued purchases in one transaction (keylanepg, %s)\n", where, sync, kind)

	v, err := sale.Run(ctx, cl, cfg, tr)
	if err != nil {
		return err
	}
	v.Print(out)
	ok := v.OK()
	if !checkRows(ctx, out, db, *namespace, v) {
		ok = false
	}
	for _, w := range local.Workers {
		s := w.Stats()
		fmt.Fprintf(out, "  worker %s: partitions %v, runs %d, acked %d, retries+failures %d, dead %d\n",
			w.ID(), w.Owned(), s.Runs, s.Succeeded, s.Failed, s.DeadLettered)
	}
	if !ok {
		fmt.Fprintln(out, "verdict (database): FAILED")
		return exitCode(1)
	}
	fmt.Fprintln(out, "verdict (database): OK")
	return nil
}

// checkRows holds the verdict against the database's rows, SKU by SKU:
// stock = start − sold, as many order rows (and units) as purchases sold,
// every order row with its recorded outcome, every "sold" outcome with its
// order row. With Calls, sold is what the buyers were told; fire and
// forget, what the stock says.
func checkRows(ctx context.Context, out io.Writer, db *pgxpool.Pool, namespace string, v sale.Verdict) bool {
	c := v.Config
	bad := 0
	var orders, told, unmatched int64
	for i := range c.SKUs {
		sku := c.Prefix + strconv.Itoa(i)
		a, err := shop.AuditSKU(ctx, db, namespace, sku)
		if err != nil {
			fmt.Fprintf(out, "database: %v\n", err)
			return false
		}
		sold := c.Stock - v.Final[i]
		if !c.FireAndForget && i < len(v.SoldBy) {
			sold = v.SoldBy[i]
		}
		orders += a.Orders
		told += sold
		unmatched += a.OrdersWithoutOutcome + a.SoldWithoutOrder
		if a.Stock != c.Stock-sold || a.Orders != sold || a.Units != sold || a.Stock != v.Final[i] {
			bad++
			fmt.Fprintf(out, "  %s: database stock %d, %d order rows (%d units); sold %d of %d, read back %d\n", sku, a.Stock, a.Orders, a.Units, sold, c.Stock, v.Final[i])
		}
	}
	fmt.Fprintf(out, "database: %d order rows for %d purchases sold, stock = start − sold for %d of %d SKUs, %d rows without their outcome (must be 0)\n",
		orders, told, c.SKUs-bad, c.SKUs, unmatched)
	return bad == 0 && unmatched == 0 && orders == told
}

// tracked has the sale's tracker see every run of h, for the verdict's
// per-key concurrency and order checks.
func tracked(h keylanepg.Handler, tr *sale.Tracker) keylanepg.Handler {
	return keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		tr.Start(job)
		defer tr.End(job)
		return h.Handle(ctx, tx, job)
	})
}

// trackedGroups has the tracker see the jobs of each of app's calls, for
// the verdict's per-key concurrency and order checks, where a
// PipelineHandler's or a SetHandler's own calls cannot tell: they queue a
// key's jobs before any statement runs, and the fast path may queue a job
// again on the careful path. A key's run spans the call: each of its
// jobs starts, in the group's order, when the one before it ends, and the
// last ends when the call returns.
type trackedGroups struct {
	app keylane.GroupApplier
	tr  *sale.Tracker
}

func (a trackedGroups) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	last := make(map[string]keylane.Job)
	for _, j := range g.Jobs {
		if prev, ok := last[j.Key]; ok {
			a.tr.End(prev)
		}
		a.tr.Start(j)
		last[j.Key] = j
	}
	defer func() {
		for _, j := range last {
			a.tr.End(j)
		}
	}()
	return a.app.ApplyGroup(ctx, g)
}
