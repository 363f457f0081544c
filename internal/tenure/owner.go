package tenure

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/kept"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/statestore"
	"github.com/keylane/keylane/internal/tracing"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Owner runs one partition for as long as this worker holds its lease:
// a tenure. Build it with New; the worker's balancer runs it (Run, as a
// balance.Owner) and ends it (HandOver, Abort).
//
// On taking the lease it deletes and re-creates the partition's durable
// consumer: jobs the previous owner fetched but never acked are delivered
// again at once, in stream order, instead of after AckWait. A paused former
// owner cannot interfere: it stopped trusting its lease before ours was
// granted, so it neither acks nor replies, and anything it stored carries an
// older fence.
type Owner struct {
	cfg   Config
	p     int
	l     *lease.Lease
	log   *slog.Logger
	stats *Stats

	// From cfg, under the names the tenure calls them by.
	topo    *namespace.Topology
	nc      *nats.Conn
	js      jetstream.JetStream
	state   *statestore.Store
	tracing *workerTracing

	ctx    context.Context // handlers' context: dies on lease loss or abort
	cancel context.CancelFunc

	handoverOnce, abortOnce sync.Once
	handoverCh, abortCh     chan struct{}
	done                    chan struct{}

	prevDelivered   uint64        // last stream sequence the previous consumer delivered
	idleInfoFailing bool          // the fetch loop's last idle consumer-info request failed
	maxAcked        atomic.Uint64 // highest stream sequence acked
	kept            *keptStore    // the tenure's kept outcomes (internal/kept)
	ln              *lanes        // the lanes of the current consumer generation

	// For Worker.Tenures: ln, the consumer's pending count at the last
	// delivery, and the jobs of the batch messages among them (backlog.go).
	lanes   atomic.Pointer[lanes]
	backlog atomic.Uint64
	ahead   batchesAhead

	// moves bounds, and moving counts, the work beside the fetch loop:
	// delayed jobs' submissions being moved into the delays stream, due
	// copies being deleted (delaymove.go). The tenure waits for them.
	moves  chan struct{}
	moving sync.WaitGroup

	// applies joins the concurrent groups of different keys for an
	// Applier into one transaction (applier.go).
	applies applyBatcher

	// open holds the batches whose outcomes are kept per batch and not
	// written yet (batchoutcomes.go).
	open openBatches
}

// How long a handed-back job stays with the server before it is delivered
// again: while its key is stalled, long enough that the redeliveries (which
// the server sends before new messages) leave room for the other keys; a
// job handed back only to make room in a full window (lanes.waitRoom),
// short.
const (
	stalledHandBackDelay = time.Second
	turnHandBackDelay    = 100 * time.Millisecond
)

// handBack returns a fetched job to the server for later delivery, without
// running it: NAK with a delay. The server keeps it pending (it still
// counts against MaxPending), but this worker's memory and MaxInFlight do
// not hold it.
func (o *Owner) handBack(t *task, stalled bool) {
	d := turnHandBackDelay
	if stalled {
		d = stalledHandBackDelay
	}
	msg := t.msg
	if b := t.batch; b != nil {
		// A batch of one (the lanes hand back no job of a batch of
		// several): its message goes back whole, and its outcomes entry is
		// no longer open here; the redelivery opens it again.
		if b.jobs != 1 {
			o.log.Error("a job of a batch of several handed back; kept instead", "job_id", t.job.ID, "jobs", b.jobs)
			return
		}
		o.open.remove(b)
		if b.claim != nil {
			b.claim.abandoned.Store(true) // its redelivery is claimed again
		}
		msg = b.msg
	}
	o.stats.HandedBack.Add(1)
	if err := msg.NakWithDelay(d); err != nil {
		o.log.Debug("hand back", "job_id", t.job.ID, "err", err)
	}
}

// Config is everything a tenure is built from, each explicit: the
// partition and its lease, the worker's connection, topology, job runner
// and limits, the stores and counters it shares with the worker's other
// tenures, and what it asks of the worker.
type Config struct {
	Partition int
	Lease     *lease.Lease
	// Log is the worker's logger; the tenure's adds the partition and
	// the fence.
	Log *slog.Logger

	NC       *nats.Conn
	JS       jetstream.JetStream
	Topology *namespace.Topology

	// Exactly one of Handler, Reducer and Applier runs the jobs.
	Handler  core.Handler
	Reducer  core.Reducer
	Applier  core.GroupApplier
	Observer *core.WorkerObserver // nil: nothing measured

	Backoff      func(attempt int) time.Duration
	MaxDeliver   int
	AckWait      time.Duration
	MaxPending   int
	MaxInFlight  int
	Concurrency  int
	StoreResults bool
	WorkerID     string
	LeaseTTL     time.Duration

	// State is the namespace's state store (a Reducer's group commits).
	State *statestore.Store
	// Kept is the worker's memory of what the server refused of batched
	// look-ups and outcome batches; OutcomeBatchMin the fewest puts sent
	// as one batch (0: none).
	Kept            *kept.Memory
	OutcomeBatchMin int
	Tracing         *tracing.Worker // nil: tracing off

	// Stats are the worker's counters, shared by its tenures.
	Stats *Stats
	// RequestReload asks the worker to look at the jobs stream now (a
	// stream of another epoch); RefreshEpoch re-reads the adopted epochs
	// (a key held for ErrEpoch).
	RequestReload func()
	RefreshEpoch  func(ctx context.Context)
}

// Stats are the counters the tenures of a worker add to.
type Stats struct {
	Runs, Succeeded, Failed, Dead, Malformed, Stale, Unacked, FromResults  atomic.Int64
	Lost, Released, Resyncs, Gaps, DeadErrors, HandedBack, ApplierRefusals atomic.Int64
}

// New returns the tenure of cfg.Partition under cfg.Lease; Run runs it.
func New(cfg Config) *Owner {
	p, l := cfg.Partition, cfg.Lease
	o := &Owner{
		cfg: cfg, p: p, l: l, stats: cfg.Stats,
		topo: cfg.Topology, nc: cfg.NC, js: cfg.JS, state: cfg.State, tracing: (*workerTracing)(cfg.Tracing),
		handoverCh: make(chan struct{}), abortCh: make(chan struct{}), done: make(chan struct{}),
		moves: make(chan struct{}, movesInFlight),
	}
	o.log = cfg.Log.With("partition", p, "fence", l.Fence())
	o.kept = kept.New(kept.Config{
		NC: cfg.NC, JS: cfg.JS, Results: cfg.Topology.Names.Results(),
		BatchMin: cfg.OutcomeBatchMin, Memory: cfg.Kept, Log: o.log, Single: cfg.Topology.Replicas == 1,
	})
	// The tenure's context ends with the lease (lost, expired), not only
	// when the fetch loop notices: a lease lost while the owner drains its
	// queued jobs after a hand-over or a re-sync, when no controller
	// watches it any more, must still cancel the running handlers.
	o.ctx, o.cancel = l.Context(context.Background())
	return o
}

// handOver asks the owner to finish what it fetched and release the lease.
func (o *Owner) handOver() { o.handoverOnce.Do(func() { close(o.handoverCh) }) }

// abort asks the owner to stop now: cancel handlers, drop queued jobs.
// abort ends the tenure at once: running handlers' contexts are cancelled,
// queued jobs do not run, nothing more is acked. It cancels o.ctx itself:
// an abort can come while the owner drains after its fetch ended (Stop's
// deadline during a hand-over), when no controller is left to do it.
func (o *Owner) abort() {
	o.abortOnce.Do(func() {
		close(o.abortCh)
		o.cancel()
	})
}

func (o *Owner) run() {
	defer close(o.done)
	defer o.moving.Wait()
	defer o.cancel()
	o.log.Info("partition acquired")

	group, run := 1, func(ts []*task) { o.process(ts[0]) }
	if o.cfg.Reducer != nil {
		group, run = maxGroup, o.runGroup
	} else if o.cfg.Applier != nil {
		group, run = maxGroup, o.runApplied
	}
	run = o.observeQueueWait(run)
	run = o.tracing.wrap(run)
	run = o.gateClaims(run) // outermost: a refused batch's jobs are neither seen nor traced
	var cons jetstream.Consumer
	pause := resyncBackoff{}
	for {
		var err error
		cons, err = o.openConsumer(&pause)
		if err != nil {
			if o.ctx.Err() == nil && !isClosed(o.abortCh) && !isClosed(o.handoverCh) {
				o.log.Error("partition consumer", "err", err)
				// Hold the lease a moment before handing it back, so a
				// missing or replaced stream does not make partitions spin
				// between acquire and release.
				t := time.NewTimer(core.ReleaseHold)
				select {
				case <-t.C:
				case <-o.abortCh:
				case <-o.handoverCh:
				case <-o.l.Done():
				}
				t.Stop()
			}
			o.release()
			return
		}
		ln := newLanes(o.cfg.Concurrency, group, o.cfg.MaxInFlight, run)
		o.ln = ln
		o.lanes.Store(ln)
		why := o.fetch(cons, ln)
		if why == nil {
			ln.close(o.ctx.Err() != nil)
			break
		}
		// Re-synchronise: what was queued here is dropped (the new
		// consumer delivers it again, in order, from the ack floor); what
		// is running finishes and acks first.
		ln.close(true)
		o.stats.Resyncs.Add(1)
		o.log.Warn("partition re-synchronising from its ack floor", "why", why)
		if !pause.wait(o.ctx, o.abortCh, o.handoverCh, o.l.Done()) {
			break
		}
	}

	// A clean hand-over (not turned into loss or abort) waits for its acks
	// to land. Release then tells a released lease from a lost one, which
	// it counts.
	if isClosed(o.handoverCh) && o.ctx.Err() == nil && cons != nil {
		o.settle(cons)
	}
	o.release()
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// settle waits until the server has applied our acks, so the successor
// (which deletes and re-creates the consumer) runs no job we finished. Acks
// of one connection are applied in order, so it is enough that the highest
// sequence we acked is applied: the consumer's ack floor reached it, or (a
// lower job handed back or never delivered keeps the floor down) the
// WorkQueue stream no longer holds it. It waits as long as it needs, until
// Stop's drain deadline aborts the owner, the lease is lost, or AckWait
// passes (by then the server redelivers what it holds anyway). Jobs the
// server sent after the fetch was drained never reached us; they stay
// unacked and go to the successor, for their first run.
func (o *Owner) settle(cons jetstream.Consumer) {
	want := o.maxAcked.Load()
	if want == 0 {
		return
	}
	// Stop settling on abort (Stop's deadline) or lease loss. cancel is
	// idempotent: the watcher and the return may both call it.
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-o.abortCh:
		case <-o.l.Done():
		case <-stop.Done():
		}
		cancel()
	}()
	if !settleAcks(o.topo.StreamOf(o.p), cons, want, stop.Done(), o.cfg.AckWait) {
		o.log.Warn("hand-over: acks not applied before the drain ended", "want", want)
	}
}

// settleAcks waits until the ack of stream sequence want is applied; it
// reports false if stop closed or limit passed first.
func settleAcks(stream jetstream.Stream, cons jetstream.Consumer, want uint64, stop <-chan struct{}, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	pause := 2 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), core.RequestTimeout)
		info, err := cons.Info(ctx)
		applied := err == nil && info.AckFloor.Stream >= want
		if !applied && err == nil {
			_, gerr := stream.GetMsg(ctx, want)
			applied = errors.Is(gerr, jetstream.ErrMsgNotFound)
		}
		cancel()
		if applied {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		t := time.NewTimer(pause)
		select {
		case <-stop:
			t.Stop()
			return false
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

func (o *Owner) release() {
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.LeaseTTL)
	defer cancel()
	err := o.l.Release(ctx)
	switch {
	case errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrExpired):
		o.stats.Lost.Add(1)
		o.log.Warn("partition lease lost", "err", err)
	case err != nil:
		o.log.Warn("partition release", "err", err)
	default:
		o.stats.Released.Add(1)
		o.log.Info("partition released")
	}
}

// Run runs the tenure (balance.Owner).
func (o *Owner) Run() { o.run() }

// HandOver asks the owner to finish and release its lease (balance.Owner).
func (o *Owner) HandOver() { o.handOver() }

// Abort asks the owner to stop now (balance.Owner).
func (o *Owner) Abort() { o.abort() }

// Done is closed once Run has returned (balance.Owner).
func (o *Owner) Done() <-chan struct{} { return o.done }

// Lease is the tenure's lease.
func (o *Owner) Lease() *lease.Lease { return o.l }

// Backlog is Tenure.Backlog: the partition's jobs not yet delivered, a
// batch message counted as its jobs (backlog.go).
func (o *Owner) Backlog() uint64 { return o.pendingJobs() }

// InFlight reports the jobs the tenure holds (fetched, not finished) and
// those a failing key handed back that have not come back yet; zeros
// before its first consumer.
func (o *Owner) InFlight() (held, handedBack int) {
	if ln := o.lanes.Load(); ln != nil {
		return ln.pending(), ln.handedBackNow()
	}
	return 0, 0
}
