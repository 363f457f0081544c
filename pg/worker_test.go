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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
	"github.com/nats-io/nats.go"
)

// Tests of keylane's workers selling out of PostgreSQL through
// WorkerConfig.Applier: a real nats-server in process, a real postgres.

// histApplier is keylanepg.Applier with the history of what Apply
// answered (applied or recorded), and hooks around each call for faults.
// It applies through ApplyPipeline with p when p is set, else through
// Apply with h.
type histApplier struct {
	db    keylanepg.DB
	h     keylanepg.Handler
	p     keylanepg.PipelineHandler
	s     keylanepg.SetHandler
	hist  *history
	calls atomic.Int64
	// before runs before Apply and returns the ctx Apply gets.
	before func(ctx context.Context, g keylane.JobGroup) context.Context
	// after runs after Apply, before the worker sees its outcomes.
	after func(g keylane.JobGroup, out []keylanepg.Outcome, err error)
}

func (a *histApplier) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	a.calls.Add(1)
	if a.before != nil {
		ctx = a.before(ctx, g)
	}
	grp := keylanepg.Group{Namespace: g.Namespace, Partition: g.Partition, Fence: g.Fence, Jobs: g.Jobs}
	var (
		out []keylanepg.Outcome
		err error
	)
	switch {
	case a.p != nil:
		out, err = keylanepg.ApplyPipeline(ctx, a.db, grp, a.p)
	case a.s != nil:
		out, err = keylanepg.ApplySet(ctx, a.db, grp, a.s)
	default:
		out, err = keylanepg.Apply(ctx, a.db, grp, a.h)
	}
	if err == nil {
		a.hist.add(out)
	}
	if a.after != nil {
		a.after(g, out, err)
	}
	if err != nil {
		return nil, keylanepg.WholeError(err) // as Applier.ApplyGroup says it
	}
	res := make([]keylane.JobOutcome, len(out))
	for i, o := range out {
		res[i] = keylane.JobOutcome{Result: o.Result, Err: o.Err, Done: o.Done()}
	}
	return res, nil
}

// ReadRecord is keylanepg.Applier's: the worker reads a job's record
// before it dead-letters it, and before it counts a whole failure.
func (a *histApplier) ReadRecord(ctx context.Context, namespace string, ids []string) (map[string][]byte, error) {
	return (&keylanepg.Applier{DB: a.db, Handler: a.h, Pipeline: a.p, Set: a.s}).ReadRecord(ctx, namespace, ids)
}

// shopApplier is a histApplier selling with the shop's handler of kind
// (one of applyKinds): shop.Sell, shop.SellPipeline or shop.SellSet.
func shopApplier(kind string, db keylanepg.DB, hist *history) *histApplier {
	switch kind {
	case "pipeline":
		return &histApplier{db: db, p: shop.SellPipeline, hist: hist}
	case "set":
		return &histApplier{db: db, s: shop.SellSet, hist: hist}
	}
	return &histApplier{db: db, h: shop.Sell, hist: hist}
}

// forKinds runs test once for each of applyKinds, as subtests named after
// them: a fault must leave the same history whichever kind applies.
func forKinds(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range applyKinds {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// startWorker starts a worker on its own connection to url, stopped when
// the test ends.
func startWorker(t testing.TB, url string, topo keylane.TopologyConfig, app keylane.GroupApplier, id string) (*keylane.Worker, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{Topology: topo, Applier: app, ID: id})
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

func newClient(t testing.TB, url string) *keylane.Client {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := keylane.NewClient(context.Background(), nc, keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// owned waits until the workers own every one of n partitions.
func owned(t testing.TB, n int, ws ...*keylane.Worker) {
	t.Helper()
	testwait.Eventually(t, time.Minute, "every partition owned", func() bool {
		k := 0
		for _, w := range ws {
			k += len(w.Owned())
		}
		return k == n
	})
}

// buyers is the buyers' side of a sale: every Call's answer by job ID.
type buyers struct {
	mu     sync.Mutex
	told   map[string]string // job ID -> answer
	sku    map[string]string // job ID -> SKU
	errs   []error
	called atomic.Int64
}

func newBuyers() *buyers { return &buyers{told: map[string]string{}, sku: map[string]string{}} }

// buy has n buyers make the purchases (SKU per purchase) with Calls, each
// with its own ID.
func (b *buyers) buy(ctx context.Context, c *keylane.Client, n int, run string, skus []string) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(skus) {
					return
				}
				id := fmt.Sprintf("%s-%d", run, i)
				b.mu.Lock()
				b.sku[id] = skus[i]
				b.mu.Unlock()
				res, err := c.Call(ctx, skus[i], []byte("buy 1"), keylane.WithID(id))
				b.mu.Lock()
				if err != nil {
					b.errs = append(b.errs, fmt.Errorf("buy %s: %w", id, err))
				} else {
					b.told[id] = string(res)
				}
				b.mu.Unlock()
				b.called.Add(1)
			}
		})
	}
	wg.Wait()
}

// check holds the sale against the history of Apply's answers and the
// database's rows (history.check: nothing applied twice, stock = start -
// sold, one order row per sale, none extra) and every buyer's answer
// against the recorded outcome: a buyer told "sold" has an order row.
func (b *buyers) check(t *testing.T, db *pgxpool.Pool, hist *history, skus []string, start int64) {
	t.Helper()
	for _, err := range b.errs {
		t.Error(err)
	}
	var ids []string
	for id := range b.sku {
		ids = append(ids, id)
	}
	for _, sku := range uniq(skus) {
		hist.check(t, db, sku, start, ids)
	}
	rec, err := keylanepg.Lookup(context.Background(), db, ns, ids)
	if err != nil {
		t.Fatal(err)
	}
	sold := 0
	for id, told := range b.told {
		if got := string(rec[id].Result); got != told {
			t.Errorf("buyer %s told %q, database recorded %q", id, told, got)
		}
		if strings.HasPrefix(told, "sold ") {
			sold++
		}
	}
	var orders int64
	for _, sku := range uniq(skus) {
		orders += audit(t, db, sku).Orders
	}
	if orders != int64(sold) {
		t.Errorf("%d order rows, %d buyers told sold", orders, sold)
	}
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var u []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			u = append(u, x)
		}
	}
	return u
}

// sale builds n purchases over skus, round robin.
func sale(n int, skus ...string) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = skus[i%len(skus)]
	}
	return s
}

// TestWorkerSellsOutOfPostgres runs two sales through two workers with
// Applier and Calls: 300 buyers' purchases of one hot SKU stocked 200 (so
// 100 are refused), and 400 of 20 SKUs stocked 15 each. The database's
// rows must match the answers: stock = start - sold, one order row per
// buyer told "sold", none extra, every job applied once, every answer the
// recorded one; and the hot SKU's jobs must have gone in groups (fewer
// transactions than jobs). Fails if the worker acks without the commit,
// applies a job twice, or runs a key's jobs one transaction each. Run for
// every kind of handler (forKinds): shop.Sell through Apply,
// shop.SellPipeline through ApplyPipeline, shop.SellSet through ApplySet.
func TestWorkerSellsOutOfPostgres(t *testing.T) { forKinds(t, testWorkerSellsOutOfPostgres) }

func testWorkerSellsOutOfPostgres(t *testing.T, kind string) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 4}
	hist := newHistory()
	app := shopApplier(kind, db, hist)
	w1, _ := startWorker(t, s.ClientURL(), topo, app, "w1")
	w2, _ := startWorker(t, s.ClientURL(), topo, app, "w2")
	owned(t, 4, w1, w2)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	setStock(t, db, "hot", 200)
	b := newBuyers()
	b.buy(ctx, c, 64, "hot", sale(300, "hot"))
	b.check(t, db, hist, []string{"hot"}, 200)
	if a := audit(t, db, "hot"); a.Orders != 200 {
		t.Errorf("hot SKU sold %d of 200 to 300 buyers", a.Orders)
	}
	if calls := app.calls.Load(); calls >= 300 {
		t.Errorf("%d transactions for 300 purchases of one SKU: not grouped", calls)
	} else {
		t.Logf("hot SKU: 300 purchases in %d transactions", calls)
	}

	var skus []string
	for i := range 20 {
		skus = append(skus, fmt.Sprintf("sku%02d", i))
		setStock(t, db, skus[i], 15)
	}
	b = newBuyers()
	b.buy(ctx, c, 64, "many", sale(400, skus...))
	b.check(t, db, hist, skus, 15)
}

// TestWorkerKilledBetweenCommitAndAck: a worker's Applier commits a group
// of purchases, then the worker's connection closes before it replies or
// acks (a process killed between the database commit and the ack). A new
// worker takes the partition over and gets the jobs again, redelivered:
// each must be answered from the database's record (Recorded), never
// applied again, and each buyer told what the record says. Fails if a
// redelivered job is applied twice (history: "applied twice"; the UNIQUE
// job_id of orders would also refuse it, failing the job), or if the
// first worker acked or replied after its connection was gone. Run for
// every kind: the pipeline's fast path sends the redelivered jobs'
// statements before it reads the record, so it must roll them back and
// answer the jobs from the record the careful way.
func TestWorkerKilledBetweenCommitAndAck(t *testing.T) {
	forKinds(t, testWorkerKilledBetweenCommitAndAck)
}

func testWorkerKilledBetweenCommitAndAck(t *testing.T, kind string) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second}
	hist := newHistory()
	setStock(t, db, "k", 50)

	var (
		crashed   atomic.Bool
		committed atomic.Int64 // jobs the crashed worker's last group applied
		ncA       *nats.Conn
		ready     = make(chan struct{})
	)
	appA := shopApplier(kind, db, hist)
	appA.before = func(ctx context.Context, g keylane.JobGroup) context.Context {
		<-ready
		return ctx
	}
	appA.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		if err != nil || crashed.Load() {
			return
		}
		n := 0
		for _, o := range out {
			if o.Status == keylanepg.Applied {
				n++
			}
		}
		if n > 0 && crashed.CompareAndSwap(false, true) {
			committed.Store(int64(n))
			ncA.Close() // dead: no reply, no ack goes out
		}
	}
	wA, nc := startWorker(t, s.ClientURL(), topo, appA, "a")
	ncA = nc
	close(ready)
	owned(t, 1, wA)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	b := newBuyers()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.buy(ctx, c, 16, "crash", sale(40, "k"))
	}()
	testwait.Eventually(t, time.Minute, "worker a committed a group and died", crashed.Load)
	appB := shopApplier(kind, db, hist)
	var recorded atomic.Int64
	appB.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		for _, o := range out {
			if o.Status == keylanepg.Recorded {
				recorded.Add(1)
			}
		}
	}
	startWorker(t, s.ClientURL(), topo, appB, "b")
	<-done
	b.check(t, db, hist, []string{"k"}, 50)
	t.Logf("worker a committed %d jobs and died; worker b answered %d from the record", committed.Load(), recorded.Load())
	if recorded.Load() < committed.Load() {
		t.Errorf("worker b answered %d jobs from the record, worker a had committed %d unacked", recorded.Load(), committed.Load())
	}
}

// TestPausedWorkerRefusedByFence: worker a takes a group of purchases and
// pauses before its transaction (a stopped process, a long GC: it does not
// notice that its lease lapsed, since its connection goes through a proxy
// that is cut meanwhile). Worker b takes the partition over with a newer
// fence. Then a resumes and runs its transaction under the old fence: the
// database must refuse it (StaleFenceError, nothing written), and nothing
// is applied twice. Two cases, for every kind of handler: "applied", b
// has sold a's jobs, redelivered, before a resumes (a's jobs are in the
// record); "unapplied", b holds them until a's transaction ended and
// first commits its fence with another SKU's purchase, so only the fence
// can refuse a's group (the pipeline's fast path has sent a's statements
// with the fence in one round trip, and must not commit them). Fails if
// a's transaction commits (it ends without error; or history: "applied
// twice", or the job's order row refused as a duplicate), or if it is
// refused for anything but the fence.
func TestPausedWorkerRefusedByFence(t *testing.T) { forKinds(t, testPausedWorkerRefusedByFence) }

func testPausedWorkerRefusedByFence(t *testing.T, kind string) {
	t.Run("applied", func(t *testing.T) { pausedWorkerRefusedByFence(t, kind, false) })
	t.Run("unapplied", func(t *testing.T) { pausedWorkerRefusedByFence(t, kind, true) })
}

// pausedWorkerRefusedByFence is TestPausedWorkerRefusedByFence; with
// hold, worker b holds the paused group's key until a's transaction ended.
func pausedWorkerRefusedByFence(t *testing.T, kind string, hold bool) {
	_, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: time.Second}
	hist := newHistory()
	setStock(t, db, "k", 50)
	setStock(t, db, "k2", 50)
	proxy := newProxy(t, s.ClientURL())

	var (
		paused  = make(chan struct{})
		resume  = make(chan struct{})
		once    sync.Once
		aErr    = make(chan error, 1)
		aFence  atomic.Uint64
		aIDs    []string // the paused group's jobs
		isPause atomic.Bool
	)
	appA := shopApplier(kind, db, hist)
	appA.before = func(ctx context.Context, g keylane.JobGroup) context.Context {
		first := false
		once.Do(func() { first = true })
		if !first {
			return ctx
		}
		isPause.Store(true)
		aFence.Store(g.Fence)
		for _, j := range g.Jobs {
			aIDs = append(aIDs, j.ID)
		}
		close(paused)
		<-resume
		// A paused process runs on as if nothing happened: its lease's
		// end is not seen before the transaction is sent.
		return context.WithoutCancel(ctx)
	}
	appA.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		if isPause.CompareAndSwap(true, false) {
			aErr <- err
		}
	}
	wA, _ := startWorker(t, proxy.URL(), topo, appA, "a")
	owned(t, 1, wA)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	b := newBuyers()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.buy(ctx, c, 8, "pause", sale(20, "k"))
	}()
	select {
	case <-paused:
	case <-ctx.Done():
		t.Fatal("worker a never applied a group")
	}
	proxy.Cut() // a's lease lapses while it is paused
	appB := shopApplier(kind, db, hist)
	var holding atomic.Bool
	holding.Store(hold)
	defer holding.Store(false)
	appB.before = func(ctx context.Context, g keylane.JobGroup) context.Context {
		if !holding.Load() {
			return ctx
		}
		for _, j := range g.Jobs {
			if j.Key == "k" {
				// Not now: the call fails, the worker tries it again
				// later (no attempt counted), and k's jobs stay unapplied.
				ctx, cancel := context.WithCancel(ctx)
				cancel()
				return ctx
			}
		}
		return ctx
	}
	startWorker(t, s.ClientURL(), topo, appB, "b")
	if hold {
		// b commits its fence with another SKU's purchase; the paused
		// group's jobs are not recorded yet.
		b.buy(ctx, c, 1, "pause-k2", []string{"k2"})
		if rec, err := keylanepg.Lookup(ctx, db, ns, aIDs); err != nil || len(rec) > 0 {
			t.Fatalf("before a resumes, %d of its group's %d jobs are recorded (%v): the fence would not be all that refuses it", len(rec), len(aIDs), err)
		}
	} else {
		<-done // every buyer answered, by b
	}
	close(resume)
	select {
	case err := <-aErr:
		var stale *keylanepg.StaleFenceError
		if !errors.As(err, &stale) || !errors.Is(err, keylane.ErrStaleFence) {
			t.Fatalf("paused worker's transaction (fence %d) ended with %v, want a StaleFenceError", aFence.Load(), err)
		}
		t.Logf("paused worker refused: %v", err)
	case <-ctx.Done():
		t.Fatal("the paused worker's transaction never ended")
	}
	holding.Store(false)
	<-done
	if err := proxy.Restore(); err != nil { // so a stops in time
		t.Fatal(err)
	}
	skus := []string{"k"}
	if hold {
		skus = append(skus, "k2")
	}
	b.check(t, db, hist, skus, 50)
}

// TestPostgresRestartMidSale: two workers sell 12 SKUs through Calls while
// the PostgreSQL server is SIGKILLed (postmaster and backends) and
// restarted, twice. The workers' transactions in flight fail with their
// fate unknown; the workers neither reply nor ack those, and apply the
// groups again once the database is back, the record answering what did
// commit. Every buyer must be answered, nothing oversold, nothing applied
// twice, nothing acknowledged that the database lacks (each "sold" answer
// has its order row and recorded outcome). Fails if a failed transaction
// is acked or dead-lettered (a buyer gets an error, or an answer with no
// row), or a job is applied twice. Run for every kind of handler.
func TestPostgresRestartMidSale(t *testing.T) { forKinds(t, testPostgresRestartMidSale) }

func testPostgresRestartMidSale(t *testing.T, kind string) {
	pg, db := startShop(t, 8)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 4}
	hist := newHistory()
	var failures atomic.Int64
	app := shopApplier(kind, db, hist)
	app.after = func(g keylane.JobGroup, out []keylanepg.Outcome, err error) {
		if err != nil {
			failures.Add(1)
		}
	}
	w1, _ := startWorker(t, s.ClientURL(), topo, app, "w1")
	w2, _ := startWorker(t, s.ClientURL(), topo, app, "w2")
	owned(t, 4, w1, w2)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var skus []string
	for i := range 12 {
		skus = append(skus, fmt.Sprintf("r%02d", i))
		setStock(t, db, skus[i], 40)
	}
	b := newBuyers()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.buy(ctx, c, 32, "restart", sale(600, skus...))
	}()
	for kill := range 2 {
		at := int64(150 + 200*kill)
		testwait.Eventually(t, 2*time.Minute, fmt.Sprintf("%d purchases answered before kill %d", at, kill+1), func() bool {
			return b.called.Load() >= at
		})
		pg.Kill()
		if err := pg.Restart(); err != nil {
			t.Fatalf("restart after kill %d: %v", kill+1, err)
		}
	}
	<-done
	b.check(t, db, hist, skus, 40)
	t.Logf("%d transactions failed across 2 kills", failures.Load())
	if failures.Load() == 0 {
		t.Error("no transaction failed: the kills hit nothing")
	}
}

func newProxy(t *testing.T, url string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestWorkerJoinsKeysInOneTransaction: with one partition, worker w's
// first transaction (one SKU's purchase) is held until four other SKUs'
// purchases are queued behind it (their runners have handed their groups
// to the Applier: counted in Stats().Runs). Those four groups must then go
// in one ApplyGroup, one transaction, and the sale check against the
// database must hold. Fails if each key's group gets a transaction of its
// own (the second call carries one SKU).
func TestWorkerJoinsKeysInOneTransaction(t *testing.T) {
	_, db := startShop(t, 4)
	s := natstest.Start(t)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 1}
	hist := newHistory()
	skus := []string{"j0", "j1", "j2", "j3", "j4"}
	for _, sku := range skus {
		setStock(t, db, sku, 10)
	}
	var (
		mu      sync.Mutex
		keysPer []int // distinct keys of each ApplyGroup, in call order
		release = make(chan struct{})
		first   sync.Once
	)
	app := &histApplier{db: db, h: shop.Sell, hist: hist}
	app.before = func(ctx context.Context, g keylane.JobGroup) context.Context {
		keys := map[string]bool{}
		for _, j := range g.Jobs {
			keys[j.Key] = true
		}
		mu.Lock()
		keysPer = append(keysPer, len(keys))
		mu.Unlock()
		first.Do(func() { <-release })
		return ctx
	}
	w, _ := startWorker(t, s.ClientURL(), topo, app, "w")
	owned(t, 1, w)
	c := newClient(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b := newBuyers()
	var wg sync.WaitGroup
	wg.Go(func() { b.buy(ctx, c, 1, "join-first", []string{"j0"}) })
	testwait.Eventually(t, time.Minute, "the first group handed to the Applier", func() bool { return w.Stats().Runs >= 1 })
	wg.Go(func() { b.buy(ctx, c, 4, "join", skus[1:]) })
	testwait.Eventually(t, time.Minute, "four more keys' groups queued behind it", func() bool { return w.Stats().Runs >= 5 })
	close(release)
	wg.Wait()
	b.check(t, db, hist, skus, 10)
	mu.Lock()
	defer mu.Unlock()
	if len(keysPer) < 2 || keysPer[1] != 4 {
		t.Errorf("keys per transaction %v, want [1 4]: the queued keys' groups must share one transaction", keysPer)
	}
}
