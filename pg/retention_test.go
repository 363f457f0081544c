package keylanepg_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
	"github.com/nats-io/nats.go"
)

// gatedApplier is keylanepg.Applier whose groups wait for its first
// prune to end: the prune runs before the redelivery it must not undo.
type gatedApplier struct {
	*keylanepg.Applier
	once   sync.Once
	pruned chan struct{}
	n      atomic.Int64
}

func (a *gatedApplier) PruneRecord(ctx context.Context, namespace string, before time.Time) (int64, error) {
	n, err := a.Applier.PruneRecord(ctx, namespace, before)
	a.n.Add(n)
	a.once.Do(func() { close(a.pruned) })
	return n, err
}

func (a *gatedApplier) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	select {
	case <-a.pruned:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return a.Applier.ApplyGroup(ctx, g)
}

// TestWorkerPrunesOutcomes: keylane_outcomes holds 5,000 outcomes of a
// day and an hour ago and 10 of another namespace. A purchase commits and
// its worker dies before the ack. The next worker, with keylanepg.Applier
// at its defaults (retention on, a day), prunes a lease TTL after its
// start, before it applies anything: the day-old outcomes of its
// namespace go, the other namespace's stay, and the late redelivery's
// outcome stays, so the redelivery is answered from the record ("sold",
// one order row), never applied twice.
func TestWorkerPrunesOutcomes(t *testing.T) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second}
	setStock(t, db, "k", 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, q := range []string{
		`INSERT INTO keylane_outcomes (namespace, job_id, key, fence, result, at)
		 SELECT $1, 'old-' || i, 'k', 1, 'sold', now() - interval '25 hours' FROM generate_series(1, 5000) AS i`,
		`INSERT INTO keylane_outcomes (namespace, job_id, key, fence, result, at)
		 SELECT 'other', 'old-' || i, 'k', 1, 'sold', now() - interval '25 hours' FROM generate_series(1, 10) AS i`,
	} {
		args := []any{}
		if strings.Contains(q, "$1") {
			args = append(args, ns)
		}
		if _, err := db.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}

	const id = "late-1"
	var died atomic.Bool
	var ncA atomic.Pointer[nats.Conn]
	ready := make(chan struct{})
	appA := shopApplier("handler", db, newHistory())
	appA.before = func(ctx context.Context, g keylane.JobGroup) context.Context { <-ready; return ctx }
	appA.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		for _, o := range out {
			if o.JobID == id && o.Done() && died.CompareAndSwap(false, true) {
				ncA.Load().Close() // dead: no reply, no ack
			}
		}
	}
	wA, nc := startWorker(t, s.ClientURL(), topo, appA, "a")
	ncA.Store(nc)
	close(ready)
	owned(t, 1, wA)
	c := newClient(t, s.ClientURL())
	type answer struct {
		res []byte
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := c.Call(ctx, "k", []byte("buy 1"), keylane.WithID(id))
		got <- answer{res, err}
	}()
	testwait.Eventually(t, time.Minute, "worker a committed the purchase and died", died.Load)

	appB := &gatedApplier{Applier: &keylanepg.Applier{DB: db, Handler: shop.Sell}, pruned: make(chan struct{})}
	startWorker(t, s.ClientURL(), topo, appB, "b")
	a := <-got
	if a.err != nil || !strings.HasPrefix(string(a.res), "sold ") {
		t.Fatalf("the late redelivery's buyer was told %q, %v", a.res, a.err)
	}
	if n := audit(t, db, "k").Orders; n != 1 {
		t.Fatalf("%d order rows, want 1: the late redelivery applied again", n)
	}
	if n := appB.n.Load(); n != 5000 {
		t.Errorf("the prune deleted %d outcomes, want the 5000 day-old ones", n)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes WHERE namespace = $1 AND job_id LIKE 'old-%'`, ns); n != 0 {
		t.Errorf("%d day-old outcomes left", n)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes WHERE namespace = 'other'`); n != 10 {
		t.Errorf("%d outcomes of the other namespace left, want 10", n)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM keylane_outcomes WHERE job_id = $1`, id); n != 1 {
		t.Errorf("the late job's outcome: %d rows, want 1", n)
	}
}

// TestEnsureAddsThePruneIndex: a keylane_outcomes made before Prune's
// index (keylane_outcomes_at) gets it from Ensure.
func TestEnsureAddsThePruneIndex(t *testing.T) {
	_, db := startShop(t, 2)
	ctx := context.Background()
	if _, err := db.Exec(ctx, `DROP INDEX keylane_outcomes_at`); err != nil {
		t.Fatal(err)
	}
	if err := keylanepg.Ensure(ctx, db); err != nil {
		t.Fatal(err)
	}
	if n := rowCount(t, db, `SELECT count(*) FROM pg_indexes WHERE indexname = 'keylane_outcomes_at'`); n != 1 {
		t.Fatalf("Ensure left keylane_outcomes without its index")
	}
}
