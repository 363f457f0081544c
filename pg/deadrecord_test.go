package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
	"github.com/nats-io/nats.go"
)

// TestCommittedJobIsNotDeadLettered: a purchase commits (stock taken,
// order row and outcome recorded), and its worker dies before it replies
// or acks (its NATS connection closed from inside the Applier, right after
// the commit: no ack, no reply, no lease renewal goes out); so does the
// next owner, which answers the redelivered job from the record and dies
// before its ack too, and so does the one after it (a job's first run is
// not counted: MaxDeliver+1 = 3 owners die in all). The fourth owner's
// restart counter is past MaxDeliver. The job must be answered from the
// database's record, "sold", as the buyer's Call and a Lookup say, never
// dead-lettered: the record says it is done. On main the third owner
// dead-lettered it without asking the database, and the buyer was told
// "job failed (dead-lettered)" for a sale the database holds.
func TestCommittedJobIsNotDeadLettered(t *testing.T) {
	forKinds(t, testCommittedJobIsNotDeadLettered)
}

func testCommittedJobIsNotDeadLettered(t *testing.T, kind string) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second}
	setStock(t, db, "k", 5)
	const id = "order-1"
	const maxDeliver = 2

	// dying is a worker that closes its connection once the Applier
	// answers the order done (applied or recorded): dead between the
	// commit and the ack.
	dying := func(name string) (*keylane.Worker, *atomic.Bool) {
		var died atomic.Bool
		var nc atomic.Pointer[nats.Conn]
		ready := make(chan struct{})
		app := shopApplier(kind, db, newHistory())
		app.before = func(ctx context.Context, g keylane.JobGroup) context.Context {
			<-ready // nc is set
			return ctx
		}
		app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
			for _, o := range out {
				if o.JobID == id && o.Done() && died.CompareAndSwap(false, true) {
					nc.Load().Close()
				}
			}
		}
		w, c := startWorkerMaxDeliver(t, s.ClientURL(), topo, app, name, maxDeliver)
		nc.Store(c)
		close(ready)
		return w, &died
	}
	w1, died1 := dying("a")
	owned(t, 1, w1)

	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type answer struct {
		res []byte
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := c.Call(ctx, "k", []byte("buy 1"), keylane.WithID(id))
		got <- answer{res, err}
	}()
	testwait.Eventually(t, time.Minute, "worker a committed the order and died", died1.Load)
	// The first run is not counted: MaxDeliver owners more answer it
	// from the record and die, and the next one's counter is past it.
	for _, name := range []string{"b", "c"}[:maxDeliver] {
		_, died := dying(name)
		testwait.Eventually(t, time.Minute, "worker "+name+" answered the order from the record and died", died.Load)
	}
	startWorkerMaxDeliver(t, s.ClientURL(), topo, shopApplier(kind, db, newHistory()), "d", maxDeliver)

	a := <-got
	rec, err := keylanepg.Lookup(context.Background(), db, ns, []string{id})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec[id]; !ok {
		t.Fatalf("the order has no record: the test's premise (committed before the crash) failed")
	}
	if a.err != nil {
		t.Fatalf("the buyer was told %v; the database's record says %q", a.err, rec[id].Result)
	}
	if string(a.res) != string(rec[id].Result) || !strings.HasPrefix(string(a.res), "sold ") {
		t.Fatalf("the buyer was told %q, the record says %q", a.res, rec[id].Result)
	}
	if n := audit(t, db, "k").Orders; n != 1 {
		t.Fatalf("%d order rows, want 1", n)
	}
}

// startWorkerMaxDeliver is startWorker with the worker's MaxDeliver.
func startWorkerMaxDeliver(t testing.TB, url string, topo keylane.TopologyConfig, app keylane.GroupApplier, id string, maxDeliver int) (*keylane.Worker, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{Topology: topo, Applier: app, ID: id, MaxDeliver: maxDeliver})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
		nc.Close()
	})
	return w, nc
}

// TestWholeGroupFailureEnds: a job whose Handler swallows a database
// error (SELECT 1/0, its error ignored) leaves the transaction aborted, so
// its group's record fails and the call fails whole, every time. On main
// the worker tried such a call again without counting, for ever: the
// job's key blocked and its buyer never answered. The job must be
// dead-lettered after MaxDeliver failures of its transaction with the job
// alone (the database answering the record's read meanwhile: not an
// outage), its buyer told so, and the purchases of other keys that ran
// beside it must all sell.
func TestWholeGroupFailureEnds(t *testing.T) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: 2 * time.Second}
	skus := []string{"a", "b", "c", "d"}
	for _, sku := range skus {
		setStock(t, db, sku, 10)
	}
	swallow := keylanepg.HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		if string(job.Payload) != "swallow" {
			return shop.Sell.Handle(ctx, tx, job)
		}
		_, _ = tx.Exec(ctx, "SELECT 1/$1::int", 0) // the error swallowed: the transaction is aborted
		return []byte("ok"), nil
	})
	w, _ := startWorkerMaxDeliver(t, s.ClientURL(), topo, &keylanepg.Applier{DB: db, Handler: swallow}, "a", 2)
	owned(t, 1, w)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	var poisonErr error
	wg.Go(func() {
		_, poisonErr = c.Call(ctx, "p", []byte("swallow"), keylane.WithID("swallow-1"))
	})
	errs := make([]error, 0)
	var mu sync.Mutex
	for i := range 12 {
		wg.Go(func() {
			res, err := c.Call(ctx, skus[i%len(skus)], []byte("buy 1"), keylane.WithID(fmt.Sprintf("buy-%d", i)))
			if err == nil && !strings.HasPrefix(string(res), "sold ") {
				err = fmt.Errorf("buy-%d answered %q", i, res)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	var re *keylane.RemoteError
	if !errors.As(poisonErr, &re) || !re.DeadLettered {
		t.Fatalf("the swallowing job's buyer was told %v; want it dead-lettered", poisonErr)
	}
	rec, err := keylanepg.Lookup(context.Background(), db, ns, []string{"swallow-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != 0 {
		t.Fatalf("the dead-lettered job has a record: %v", rec)
	}
}
