package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
	pgshop "github.com/keylane/keylane/pg/shop"
)

// The rows of a sale whose stock and orders live in PostgreSQL: keylane
// in front of it (keylanepg.Applier, pgshop.Sell) beside PostgreSQL alone,
// each purchase its own transaction (pgshop.BuyConditional,
// pgshop.BuyForUpdate). Every run starts its own throwaway server.
const (
	pgKeylaneRow   = "keylane → Postgres"
	pgSubmitRow    = "keylane → Postgres Submit"
	pgUpdateRow    = "Postgres UPDATE"
	pgForUpdateRow = "Postgres FOR UPDATE tx"
)

// pgSale sells from a postgres of its own, started by Setup.
type pgSale struct {
	name  string
	noIDs bool // a labelled variant: keylane names the jobs (no caller's ID)

	dir    string
	srv    *pgtest.Server
	db     *pgxpool.Pool
	local  *sale.Local     // keylane → Postgres
	client *keylane.Client // keylane → Postgres
	stages *stages         // KEYLANE_BENCH_STAGES
}

func (p *pgSale) Name() string {
	if p.noIDs {
		return p.name + ", no IDs"
	}
	return p.name
}

func (p *pgSale) Kind() Kind {
	if p.keylane() {
		return Keylane
	}
	return Peer
}

// keylane tells whether the row sells through keylane's workers.
func (p *pgSale) keylane() bool { return p.name == pgKeylaneRow || p.name == pgSubmitRow }

// pgSettings are the server's settings beside pgtest's (max_connections
// 300), as the pgbench figures had them; fsync stays on.
func pgSettings(durable bool) []string {
	sc := "off"
	if durable {
		sc = "on"
	}
	return []string{"shared_buffers=256MB", "synchronous_commit=" + sc}
}

// Setup starts a postgres (synchronous_commit on when env.Durable, off
// otherwise), creates keylane's tables and the shop's, and for keylane's
// row the workers: an embedded NATS server syncing every write when
// env.Durable, and 3 workers applying through keylanepg.Applier.
func (p *pgSale) Setup(ctx context.Context, env Env) error {
	var err error
	if p.dir, err = os.MkdirTemp("", "keylane-bench-pg-"); err != nil {
		return err
	}
	// A directory of its own under dir: pgtest opens base's parent to
	// traverse when it runs postgres as nobody.
	base := filepath.Join(p.dir, "pg")
	if err := os.Mkdir(base, 0o700); err != nil {
		return err
	}
	if p.srv, err = pgtest.New(base, pgSettings(env.Durable)...); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(p.srv.URL("postgres", "postgres"))
	if err != nil {
		return err
	}
	cfg.MaxConns = 280 // a connection per buyer, below max_connections
	if p.keylane() {
		p.stages = newStages()
		if t := p.stages.tracer(); t != nil {
			cfg.ConnConfig.Tracer = t
		}
	}
	if p.db, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	if err := keylanepg.Ensure(ctx, p.db); err != nil {
		return err
	}
	if _, err := p.db.Exec(ctx, pgshop.Schema); err != nil {
		return err
	}
	if !p.keylane() {
		return nil
	}
	natsSync := env.Durable && envInt("KEYLANE_BENCH_PG_NATS_SYNC", 1) > 0
	p.local, err = sale.StartLocal(ctx, sale.LocalConfig{
		WorkerObserver: p.stages.worker(), ClientObserver: p.stages.client(),
		SyncAlways: natsSync, Workers: workers, OutcomeBatch: outcomeBatch(natsSync), BatchCork: pgCork(natsSync),
		Topology:    keylane.TopologyConfig{Partitions: envInt("KEYLANE_BENCH_PG_PARTITIONS", pgPartitions), StreamShards: envInt("KEYLANE_BENCH_PG_SHARDS", 0)},
		Concurrency: envInt("KEYLANE_BENCH_PG_CONCURRENCY", 0),
		Applier:     pgApplier(p.db),
	})
	if err != nil {
		return err
	}
	p.client, err = p.local.Client(ctx)
	return err
}

func (p *pgSale) Run(ctx context.Context, w Workload) (Result, error) {
	s := pgShop{db: p.db, stages: p.stages}
	q := queueShop{keylaneQueue{c: p.client, callIDs: !p.noIDs && envInt("KEYLANE_BENCH_CALL_IDS", 1) != 0, submitIDs: !p.noIDs && envInt("KEYLANE_BENCH_SUBMIT_IDS", 1) != 0}}
	switch p.name {
	case pgKeylaneRow, pgSubmitRow:
		s.purchase = q.buy
	case pgUpdateRow:
		s.purchase = func(ctx context.Context, sku, _ string) (bool, int, error) {
			sold, err := pgshop.BuyConditional(ctx, p.db, sku)
			return sold, 0, err
		}
	default:
		s.purchase = func(ctx context.Context, sku, id string) (bool, int, error) {
			sold, err := pgshop.BuyForUpdate(ctx, p.db, sku, id)
			return sold, 0, err
		}
	}
	worker := 0
	if p.local != nil {
		worker = os.Getpid()
	}
	// The server's CPU is not measured: postgres is a process per
	// connection, and /proc counts a child's time to its parent only
	// once it has exited.
	var sh shop = s
	if p.name == pgSubmitRow {
		sh = pgBulkShop{s, q}
	}
	res, err := sell(ctx, w, sh, p.name == pgSubmitRow, 0, worker)
	p.stages.report(os.Stderr, w.Label()+" | "+p.Name())
	if err != nil || p.name == pgUpdateRow {
		return res, err
	}
	// The orders are the database's own record of the sale: one row per
	// unit sold, none extra.
	var orders int64
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.db.QueryRow(qctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		return res, fmt.Errorf("count the orders: %w", err)
	}
	res.Lost += max(0, res.Sold-orders)
	res.Mismatch += max(0, orders-res.Sold)
	return res, nil
}

func (p *pgSale) Teardown(ctx context.Context) {
	if p.client != nil {
		p.client.Close()
	}
	if p.local != nil {
		p.local.Stop(ctx)
	}
	if p.db != nil {
		p.db.Close()
	}
	if p.srv != nil {
		_ = p.srv.Stop()
	}
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
	*p = pgSale{name: p.name, noIDs: p.noIDs}
}

// pgShop keeps the stock in PostgreSQL's stock table and sells through
// purchase.
type pgShop struct {
	db       *pgxpool.Pool
	stages   *stages // KEYLANE_BENCH_STAGES, keylane's rows
	purchase func(ctx context.Context, sku, id string) (bool, int, error)
}

func (s pgShop) stock(ctx context.Context, skus []string, n int64) error {
	err := pgshop.SetStock(ctx, s.db, skus, n)
	s.stages.reset() // stocking is not the sale
	return err
}

func (s pgShop) buy(ctx context.Context, sku, id string) (bool, int, error) {
	return s.purchase(ctx, sku, id)
}

func (s pgShop) levels(ctx context.Context, skus []string) ([]int64, error) {
	return pgshop.Levels(ctx, s.db, skus)
}

// The keylane → Postgres rows send every purchase with its order ID (a
// caller's ID), as a shop does, like keylane's own rows; the ", no IDs"
// variant lets keylane name the jobs. Exactly once holds either way, by
// the job's ID, in keylane_outcomes. KEYLANE_BENCH_CALL_IDS and
// KEYLANE_BENCH_SUBMIT_IDS set to 0 turn the IDs off in every row.

// pgBulkShop submits purchases through keylane and waits until its
// jobs stream is empty; the stock is read from the database.
type pgBulkShop struct {
	pgShop
	q queueShop
}

func (s pgBulkShop) submit(ctx context.Context, skus, ids []string) error {
	return s.q.submit(ctx, skus, ids)
}

func (s pgBulkShop) settle(ctx context.Context) error { return s.q.settle(ctx) }

// pgAvailable reports whether postgres's binaries are installed, and
// where it looked when not.
func pgAvailable() (string, error) {
	dir, err := pgtest.BinDir()
	if err != nil {
		return "", err
	}
	for _, bin := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("no %s in %s: install Debian's postgresql package, or leave the Postgres rows out with --only", bin, dir)
		}
	}
	return dir, nil
}

// pgPartitions is the keylane → Postgres rows' partitions. In front of a
// database a partition is a stream of transactions (one at a time: its
// fence row), and with fewer partitions every batch message, its fsync
// and every transaction carry more jobs; the workers' Applier runs 64
// keys of a partition at once (DefaultApplierConcurrency). One-row runs
// on a quiet machine, 2026-11-26, skewed durable, jobs/s (Call; Submit):
// 1 partition 10,802 and 10,825 (19,843; 18,768), 2 partitions 8,284 and
// 7,620 (24,893; 24,111), 4 partitions 5,315 and 5,402 (28,407; 30,342):
//
//	KEYLANE_BENCH_PG_PARTITIONS=N bench --only 'skewed b=64 fsync,keylane → Postgres' --buyers 64 --runs 1 --placement embedded
//
// One partition is the Calls' best, which the targets are about; Submit
// would rather have four.
const pgPartitions = 1

// pgApplier is the keylane → Postgres rows' applier: shop.SellSet, each
// transaction's reads in one round trip and its writes, a statement for
// all its jobs' stock rows and one for their order rows, in the next;
// KEYLANE_BENCH_PG_SET=0 makes it shop.SellPipeline (a statement a job,
// all in one round trip), and with KEYLANE_BENCH_PG_PIPELINE=0 too
// shop.Sell (a round trip per statement). Interleaved one-row runs on a
// quiet machine, skewed-ample durable Call, jobs/s: pipeline 10,456 and
// 10,314, set 10,846 and 11,065; the set's transaction sends 9 statements
// for its 17 jobs (with the idle timeout), the pipeline's 23.
//
//	KEYLANE_BENCH_PG_SET=0 bench --only 'skewed-ample,postgres keylane' --buyers 64 --runs 1 --placement embedded
func pgApplier(db *pgxpool.Pool) *keylanepg.Applier {
	a := &keylanepg.Applier{DB: db, IdleTimeout: keylane.DefaultLeaseTTL / 2, MaxJobs: envInt("KEYLANE_BENCH_PG_MAX_JOBS", 0)}
	if envInt("KEYLANE_BENCH_PG_SET", 1) > 0 {
		a.Set = pgshop.SellSet
	} else if envInt("KEYLANE_BENCH_PG_PIPELINE", 1) > 0 {
		a.Pipeline = pgshop.SellPipeline
	} else {
		a.Handler = pgshop.Sell
	}
	return a
}

// pgCork is the keylane → Postgres clients' BatchCork: a millisecond when
// keylane's NATS server syncs every write, none otherwise;
// KEYLANE_BENCH_PG_CORK (a duration) overrides it. Corked, the buyers
// that come back together once their batch is answered go as one batch
// message (one fsync, one transaction) instead of a lone job and then the
// rest: one-row runs on a quiet machine, durable Call jobs/s, hot and
// skewed, no cork 11,400 and 9,654, 10,878 and 10,139; a 300µs cork
// 11,997 and 10,934, 13,200 and 11,146; a 1ms cork 13,534 and 10,598,
// 13,097 and 11,017 (2026-11-26, --only 'fsync,keylane → Postgres'
// --buyers 64 --runs 1 --placement embedded).
func pgCork(natsSync bool) time.Duration {
	if v := os.Getenv("KEYLANE_BENCH_PG_CORK"); v != "" {
		if d, err := time.ParseDuration(v); err == nil { // checkKnobs refused any other
			return d
		}
	}
	if natsSync {
		return time.Millisecond
	}
	return 0
}
