package keylanepg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
	"github.com/keylane/keylane/pg/shop"
)

const ns = "shop"

// startShop starts a real PostgreSQL, connects a pool of maxConns, and
// sets up keylane's tables and the shop's.
func startShop(t testing.TB, maxConns int32) (*pgtest.Server, *pgxpool.Pool) {
	t.Helper()
	s := pgtest.Start(t)
	return s, connectShop(t, s, maxConns)
}

func connectShop(t testing.TB, s *pgtest.Server, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := keylanepg.Ensure(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, shop.Schema); err != nil {
		t.Fatal(err)
	}
	return pool
}

func setStock(t testing.TB, db *pgxpool.Pool, sku string, n int64) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `INSERT INTO stock (sku, n) VALUES ($1, $2) ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n`, sku, n); err != nil {
		t.Fatal(err)
	}
}

func buy(id, sku string) keylane.Job {
	return keylane.Job{ID: id, Key: sku, Payload: []byte("buy 1")}
}

func group(partition int, fence uint64, jobs ...keylane.Job) keylanepg.Group {
	return keylanepg.Group{Namespace: ns, Partition: partition, Fence: fence, Jobs: jobs}
}

// counting wraps a Handler and counts its runs per job ID.
type counting struct {
	h    keylanepg.Handler
	runs map[string]*atomic.Int64
}

func count(h keylanepg.Handler, ids ...string) *counting {
	c := &counting{h: h, runs: map[string]*atomic.Int64{}}
	for _, id := range ids {
		c.runs[id] = new(atomic.Int64)
	}
	return c
}

func (c *counting) Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	if n, ok := c.runs[job.ID]; ok {
		n.Add(1)
	}
	return c.h.Handle(ctx, tx, job)
}

func (c *counting) total() int64 {
	var n int64
	for _, r := range c.runs {
		n += r.Load()
	}
	return n
}

func audit(t testing.TB, db *pgxpool.Pool, sku string) shop.Audit {
	t.Helper()
	a, err := shop.AuditSKU(context.Background(), db, ns, sku)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// results lists outcomes as "id status result" lines, for comparing.
func results(out []keylanepg.Outcome) []string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = fmt.Sprintf("%s %s %s", o.JobID, o.Status, o.Result)
		if o.Err != nil {
			s[i] += " err=" + o.Err.Error()
		}
	}
	return s
}

func rowCount(t testing.TB, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
