package keylane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Topology names the namespace and, for the first worker, how to create
	// it. See TopologyConfig for its defaults.
	Topology TopologyConfig
	// Handler runs the jobs. Exactly one of Handler and Reducer is required.
	Handler Handler
	// Reducer runs the jobs as pure updates of their key's state, which the
	// worker keeps and group-commits (see Reducer). It is the fast path:
	// one state write per group of a key's queued jobs instead of per job.
	Reducer Reducer
	// ID names this worker in the members bucket, on lease entries and on
	// dead letters. Defaults to "<hostname>-<pid>-<random>". Letters,
	// digits, '_' and '-' only.
	ID string
	// Concurrency is how many different keys of one partition may run at
	// once. Jobs of one key never run at the same time whatever this is.
	// Defaults to 8.
	Concurrency int
	// MaxInFlight is how many fetched, unfinished jobs one partition holds
	// in memory. It bounds memory. Defaults to 1024.
	MaxInFlight int
	// MaxPending is the partition's window on the server (the consumer's
	// MaxAckPending): jobs delivered and not acked, including those a
	// failing key handed back while its head job retries. Other keys of
	// the partition keep flowing until a failing key has about
	// MaxPending−MaxInFlight jobs handed back. Defaults to 16×MaxInFlight.
	MaxPending int
	// MaxDeliver is how many times a failing job runs before it is moved to
	// the dead-letter stream. Defaults to 5.
	MaxDeliver int
	// Backoff returns the pause before attempt n+1 after attempt n failed.
	// Defaults to 50ms doubling per attempt, at most 5s.
	Backoff func(attempt int) time.Duration
	// AckWait is how long the server waits for an ack before redelivering.
	// Jobs that wait or run longer are kept alive with InProgress every
	// AckWait/3. Defaults to 30s.
	AckWait time.Duration
	// SafetyMargin is subtracted from the lease TTL to get the trust window.
	// Defaults to LeaseTTL/10.
	SafetyMargin time.Duration
	// StoreResults stores every job's result in the results bucket before
	// replying, so a caller can fetch a result it missed and a redelivered
	// job returns its stored result instead of running again. Defaults to
	// false.
	StoreResults bool
	// TracerProvider turns tracing on: each job gets a consumer span,
	// child of the span its Submit or Call sent in the job's headers, with
	// child spans for its queue wait, each run (the context passed to the
	// Handler or Reducer carries it) and its commit (see the package doc,
	// "Tracing"). Defaults to nil: no span, no header read, nothing
	// allocated per job. The global provider is never used unless passed
	// here.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from job headers. Defaults to
	// W3C Trace Context (propagation.TraceContext{}). Used only with a
	// TracerProvider.
	Propagator propagation.TextMapPropagator
	// Logger receives the worker's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Observer receives the worker's measurements (queue wait, run time,
	// group size, end-to-end latency, lease renews) for metrics; see
	// package metrics. Defaults to nil: nothing is measured, at no cost.
	Observer *WorkerObserver
}

var workerIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

var notIDChar = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// DefaultWorkerID returns "<hostname>-<pid>-<random>", with characters a
// worker ID may not hold replaced by '_'. It differs on every call.
func DefaultWorkerID() string {
	host, _ := os.Hostname()
	return notIDChar.ReplaceAllString(host, "_") + "-" + strconv.Itoa(os.Getpid()) + "-" + nuid.Next()[16:]
}

func (c *WorkerConfig) setDefaults() error {
	if (c.Handler == nil) == (c.Reducer == nil) {
		return errors.New("keylane: WorkerConfig needs exactly one of Handler and Reducer")
	}
	if err := c.Topology.setDefaults(); err != nil {
		return err
	}
	if c.ID == "" {
		c.ID = DefaultWorkerID()
	}
	if !workerIDRE.MatchString(c.ID) {
		return fmt.Errorf("keylane: worker ID %q must match %s", c.ID, workerIDRE)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.MaxPending == 0 {
		c.MaxPending = 16 * c.MaxInFlight
	}
	if c.MaxPending < c.MaxInFlight {
		return fmt.Errorf("keylane: MaxPending %d is below MaxInFlight %d", c.MaxPending, c.MaxInFlight)
	}
	if c.Concurrency < 1 || c.MaxInFlight < 1 || c.MaxDeliver < 1 {
		return errors.New("keylane: Concurrency, MaxInFlight and MaxDeliver must be positive")
	}
	if c.Backoff == nil {
		c.Backoff = defaultBackoff
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.AckWait < MinAckWait {
		return fmt.Errorf("keylane: AckWait %s is below %s", c.AckWait, MinAckWait)
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.Topology.LeaseTTL / 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Stats counts what a worker did. All fields are totals since start.
type Stats struct {
	Runs         int64 // handler invocations, retries included
	Succeeded    int64 // jobs acked after success
	Failed       int64 // handler errors (each retried or dead-lettered)
	DeadLettered int64 // jobs moved to the dead-letter stream
	Malformed    int64 // messages on our subjects that were not valid jobs
	Stale        int64 // jobs abandoned because a newer fence had written
	Unacked      int64 // finished jobs not acked because the lease was not trusted
	FromResults  int64 // redelivered jobs answered from the results bucket
	Acquired     int64 // partition leases acquired
	Lost         int64 // partition leases lost (not released)
	Released     int64 // partition leases released gracefully
	Owned        int64 // partitions owned now
	// Resyncs counts re-synchronisations of a partition's delivery (a gap
	// in the consumer's delivery sequence, a reconnect, missed heartbeats).
	Resyncs int64
	// Gaps counts jobs refused because a later job of their key had been
	// applied and their own outcome was not held (ErrGap); each was
	// dead-lettered, never answered as a success.
	Gaps int64
	// DeadLetterErrors counts failed attempts to write a dead letter; the
	// job stays in its lane, unacked, until one succeeds.
	DeadLetterErrors int64
	// HandedBack counts jobs a stalled key handed back to the server.
	HandedBack int64
	// Stuck counts owners whose handlers kept running after the lease was
	// lost; the worker steps aside as the partition's desired owner until
	// they return.
	Stuck int64
}

type stats struct {
	runs, succeeded, failed, dead, malformed, stale, unacked, fromResults atomic.Int64
	acquired, lost, released, owned                                       atomic.Int64
	resyncs, gaps, deadErrors, handedBack                                 atomic.Int64
	stuck                                                                 atomic.Int64
}

// Worker owns partitions and runs their jobs. Create it with NewWorker,
// start it with Start, and stop it with Stop (graceful) or by cancelling the
// context given to Run. Its methods are safe for concurrent use.
type Worker struct {
	cfg   WorkerConfig
	nc    *nats.Conn
	js    jetstream.JetStream
	topo  *Topology
	state *State // the namespace's state, bound at Start (State)
	log   *slog.Logger

	tracing *workerTracing // nil: tracing off

	stats stats
	bal   *balancer

	mu       sync.Mutex
	started  bool
	stopped  bool
	done     chan struct{} // closed once Stop has returned
	doneOnce sync.Once

	// The topology watcher: it reloads the topology when the jobs stream
	// is replaced (Repartition).
	reload    chan struct{}
	watchStop chan struct{}
	watchDone chan struct{}
}

// NewWorker checks cfg and returns a worker that has not started. The
// connection stays the caller's and must outlive the worker.
func NewWorker(nc *nats.Conn, cfg WorkerConfig) (*Worker, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, nc: nc, js: js, log: cfg.Logger.With("worker", cfg.ID), done: make(chan struct{}), state: &State{keep: HeldJobs, cache: map[string]cachedEntry{}}}
	w.tracing = newWorkerTracing(cfg)
	return w, nil
}

// ID returns the worker's ID.
func (w *Worker) ID() string { return w.cfg.ID }

// Start sets up the namespace (idempotently), registers the worker as a
// member and starts balancing. It returns once the worker is registered;
// partitions are taken in the background. A request the server refuses
// (a permissions violation) ends it with that refusal.
func (w *Worker) Start(ctx context.Context) (err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := w.nc.LastError()
	ctx, stopWatch := refusalWatch(ctx, w.nc, before, apiSubjects)
	defer func() { err = startRefused(ctx, w.nc, before, err); stopWatch() }()
	if w.started {
		return errors.New("keylane: worker already started")
	}
	topo, err := Setup(ctx, w.js, w.cfg.Topology)
	if err != nil {
		return err
	}
	w.topo = topo
	w.state.bind(topo)
	w.bal, err = startBalancer(ctx, w)
	if err != nil {
		return err
	}
	w.started = true
	w.reload, w.watchStop, w.watchDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go w.watchTopology()
	w.log.Info("worker started", "partitions", topo.Partitions, "namespace", topo.Names.Namespace)
	return nil
}

// requestReload asks the topology watcher to look at the jobs stream now.
func (w *Worker) requestReload() {
	select {
	case w.reload <- struct{}{}:
	default:
	}
}

// watchTopology looks at the jobs stream every lease TTL (and when an
// owner asks) and reloads the topology when the stream was replaced by
// another epoch: a repartition. Owners never consume a stream of another
// epoch than the worker's topology (resetConsumer checks).
func (w *Worker) watchTopology() {
	defer close(w.watchDone)
	t := time.NewTicker(w.cfg.Topology.LeaseTTL)
	defer t.Stop()
	for {
		select {
		case <-w.watchStop:
			return
		case <-t.C:
		case <-w.reload:
		}
		if meta, ok := w.replacedBy(); ok {
			w.reloadTopology(meta)
		}
	}
}

// replacedBy reports the jobs streams' metadata when the epoch of any
// shard is not the worker's.
func (w *Worker) replacedBy() (Meta, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	w.mu.Lock()
	topo := w.topo
	w.mu.Unlock()
	_, metas, err := openShards(ctx, w.js, topo.Names.Namespace)
	if err != nil {
		return Meta{}, false
	}
	replaced := len(metas) != len(topo.Epochs)
	for i := 0; !replaced && i < len(metas); i++ {
		replaced = metas[i].Epoch != topo.Epochs[i]
	}
	return joinMeta(metas), replaced
}

// reloadTopology hands every partition over, opens the new jobs stream
// (never creating one: only Repartition does that) and balances again.
func (w *Worker) reloadTopology(meta Meta) {
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	w.log.Warn("jobs stream replaced; reloading the topology", "partitions", meta.Partitions, "epoch", formatEpoch(meta.Epoch))
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.Topology.LeaseTTL)
	_ = bal.stop(ctx)
	cancel()
	cfg := w.cfg.Topology
	cfg.Partitions, cfg.StreamShards = 0, 0 // follow the streams
	pause := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		var topo *Topology
		_, err := Open(ctx, w.js, cfg.Namespace, 0)
		if err == nil {
			topo, err = Setup(ctx, w.js, cfg)
		}
		if err == nil {
			w.mu.Lock()
			if w.stopped {
				w.mu.Unlock()
				cancel()
				return
			}
			w.topo = topo
			w.state.bind(topo)
			bctx, bcancel := context.WithTimeout(context.Background(), 3*w.cfg.Topology.LeaseTTL)
			w.bal, err = startBalancer(bctx, w)
			bcancel()
			w.mu.Unlock()
		}
		cancel()
		if err == nil {
			w.log.Info("topology reloaded", "partitions", topo.Partitions)
			return
		}
		w.log.Warn("reload topology", "err", err)
		t := time.NewTimer(pause)
		select {
		case <-w.watchStop:
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// Stop stops gracefully: it leaves the member set, stops fetching, finishes
// and acks the jobs it holds, and releases its leases so successors start at
// once. If ctx ends first, running handlers are cancelled and queued jobs
// are left unacked for the successor. Stop waits for every goroutine.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.started || w.stopped {
		w.mu.Unlock()
		if !w.started {
			w.doneOnce.Do(func() { close(w.done) })
		}
		return nil
	}
	w.stopped = true
	w.mu.Unlock()
	close(w.watchStop)
	<-w.watchDone
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	err := bal.stop(ctx)
	w.log.Info("worker stopped", "released", w.stats.released.Load())
	w.doneOnce.Do(func() { close(w.done) })
	return err
}

// State is the worker's view of the namespace's state bucket, for a
// Handler that keeps per-key state with State.Apply: it exists from
// NewWorker on, so a handler can hold it before the worker starts, and it
// works once Start has set the namespace up (before that its methods
// return ErrNotStarted). A Reducer worker keeps its reducer's state in the
// same State. It follows the worker across a repartition.
func (w *Worker) State() *State { return w.state }

// Done is closed once the worker has stopped: Stop (or Run) returned, every
// lease it could release released, every goroutine ended. A worker that
// never started is done once Stop is called.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Run starts the worker, blocks until ctx ends, then stops it gracefully
// within drain.
func (w *Worker) Run(ctx context.Context, drain time.Duration) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	return w.Stop(sctx)
}

// Owned returns the partitions this worker owns now.
func (w *Worker) Owned() []int {
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	if bal == nil {
		return nil
	}
	return bal.owned()
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	s := &w.stats
	return Stats{
		Runs: s.runs.Load(), Succeeded: s.succeeded.Load(), Failed: s.failed.Load(),
		DeadLettered: s.dead.Load(), Malformed: s.malformed.Load(), Stale: s.stale.Load(),
		Unacked: s.unacked.Load(), FromResults: s.fromResults.Load(),
		Acquired: s.acquired.Load(), Lost: s.lost.Load(), Released: s.released.Load(), Owned: s.owned.Load(),
		Resyncs: s.resyncs.Load(), Gaps: s.gaps.Load(), DeadLetterErrors: s.deadErrors.Load(), HandedBack: s.handedBack.Load(),
		Stuck: s.stuck.Load(),
	}
}

// Topology returns the namespace's objects; nil before Start.
func (w *Worker) Topology() *Topology {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.topo
}

func (w *Worker) leaseConfig() lease.Config {
	return lease.Config{Holder: w.cfg.ID, TTL: w.cfg.Topology.LeaseTTL, SafetyMargin: w.cfg.SafetyMargin, Logger: w.cfg.Logger, Renewed: w.cfg.leaseRenewed()}
}

// refreshEpoch re-reads the jobs streams' adopted epochs, so a key held
// for ErrEpoch runs once an operator adopted its epoch.
func (w *Worker) refreshEpoch(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var adopted []uint64
	for i, s := range w.topo.Streams {
		info, err := s.Info(ctx)
		if err != nil {
			return
		}
		meta, err := readMeta(info, w.topo.Partitions)
		if err != nil || meta.Epoch != w.topo.Epochs[i] {
			return
		}
		for _, e := range meta.Adopted {
			if !slices.Contains(adopted, e) {
				adopted = append(adopted, e)
			}
		}
	}
	w.state.adopt(adopted)
}
