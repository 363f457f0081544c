package keylane

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/buildinfo"
	"github.com/keylane/keylane/internal/kept"
	"github.com/keylane/keylane/internal/tracing"

	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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

	tracing *tracing.Worker // nil: tracing off

	stats stats
	kept  kept.Memory // what the server refused of the batched look-ups and outcome batches
	bal   *balancer

	mu       sync.Mutex
	started  bool
	stopped  bool
	failed   error         // why the worker stopped on its own (Err)
	done     chan struct{} // closed once Stop has returned
	doneOnce sync.Once

	// The topology watcher: it reloads the topology when the jobs stream
	// is replaced (Repartition).
	reload    chan struct{}
	watchStop chan struct{}
	watchDone chan struct{}
	// pruneDone is closed when the record's pruner (recordprune.go)
	// ended; nil when none runs.
	pruneDone chan struct{}
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
	w := &Worker{cfg: cfg, nc: nc, js: js, log: cfg.Logger.With("worker", cfg.ID), done: make(chan struct{}), state: newWorkerState()}
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
	topo, err := setup(ctx, w.js, w.cfg.Topology, w.log)
	if err != nil {
		return err
	}
	if w.cfg.MaxDeliver == 0 {
		w.cfg.MaxDeliver = cmp.Or(topo.Meta.MaxDeliver, DefaultMaxDeliver) // the namespace's (Setup fixed it if none was)
	}
	retention, err := w.checkRecordRetention()
	if err != nil {
		return err
	}
	w.topo = topo
	w.state.bind(topo)
	if w.stateBatchOn() {
		// Only a worker that turns state batches on asks for the flag
		// (an R3 stream update): Setup leaves the state bucket as it was.
		if err := allowAtomicPublish(ctx, w.js, "KV_"+topo.Names.State()); err != nil {
			w.log.Warn("state bucket: atomic batches not allowed; state writes go one by one when refused", "err", err)
		}
	}
	w.state.batchWrites(w.stateBatchOn(), w.nc, topo.Names.State())
	w.bal, err = startBalancer(ctx, w)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		w.state.closeBatches(cctx) // started above, with no Stop to end it
		cancel()
		return err
	}
	w.started = true
	w.reload, w.watchStop, w.watchDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go w.watchTopology()
	if retention > 0 {
		w.pruneDone = make(chan struct{})
		go w.pruneRecord(topo.Names.Namespace, retention, w.watchStop, w.pruneDone)
	}
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
	lastErr := ""
	for {
		select {
		case <-w.watchStop:
			return
		case <-t.C:
		case <-w.reload:
		}
		meta, ok, err := w.replacedBy()
		if err != nil {
			// Said once until it changes (every lease TTL otherwise): a
			// namespace whose metadata is refused (a bad keylane.max-deliver,
			// shards that disagree) or a server that does not answer leaves the worker on the topology it has.
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				w.log.Warn("jobs stream's metadata unread; the topology stays as it is", "err", err)
			}
			continue
		}
		lastErr = ""
		if ok {
			w.reloadTopology(meta)
		}
	}
}

// Err returns why the worker stopped on its own, nil while it runs or
// when it was stopped (Stop, Run's context).
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// replacedBy reports the jobs streams' metadata, and whether the epoch of
// any shard is not the worker's; err when it could not be read or was
// refused.
func (w *Worker) replacedBy() (Meta, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	w.mu.Lock()
	topo := w.topo
	w.mu.Unlock()
	_, metas, err := openShards(ctx, w.js, topo.Names.Namespace)
	if err != nil {
		return Meta{}, false, err
	}
	replaced := len(metas) != len(topo.Epochs)
	for i := 0; !replaced && i < len(metas); i++ {
		replaced = metas[i].Epoch != topo.Epochs[i]
	}
	return joinMeta(metas), replaced, nil
}

// reloadTopology hands every partition over, opens the new jobs stream
// (never creating one: only Repartition does that) and balances again.
func (w *Worker) reloadTopology(meta Meta) {
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	w.log.Warn("jobs stream replaced; reloading the topology", "partitions", meta.Partitions, "epoch", formatEpoch(meta.Epoch))
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.Topology.LeaseTTL)
	_ = bal.Stop(ctx)
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
			w.state.batchWrites(w.stateBatchOn(), w.nc, topo.Names.State())
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
	if w.pruneDone != nil {
		<-w.pruneDone
	}
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	err := bal.Stop(ctx)
	w.state.closeBatches(ctx)
	w.log.Info("worker stopped", "released", w.stats.Released.Load())
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
// within drain. A worker that stops on its own (Err) ends Run with its
// reason.
func (w *Worker) Run(ctx context.Context, drain time.Duration) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-w.done:
		return w.Err()
	}
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
	return bal.Owned()
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	s := &w.stats
	return Stats{
		Runs: s.Runs.Load(), Succeeded: s.Succeeded.Load(), Failed: s.Failed.Load(),
		DeadLettered: s.Dead.Load(), Malformed: s.Malformed.Load(), Stale: s.Stale.Load(),
		Unacked: s.Unacked.Load(), FromResults: s.FromResults.Load(),
		Acquired: s.acquired.Load(), Lost: s.Lost.Load(), Released: s.Released.Load(), Owned: int64(len(w.Owned())),
		Resyncs: s.Resyncs.Load(), Gaps: s.Gaps.Load(), DeadLetterErrors: s.DeadErrors.Load(), HandedBack: s.HandedBack.Load(),
		Stuck: s.stuck.Load(), ApplierRefusals: s.ApplierRefusals.Load(), RenewFailures: s.renewFailures.Load(),
	}
}

// Topology returns the namespace's objects; nil before Start.
func (w *Worker) Topology() *Topology {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.topo
}

func (w *Worker) leaseConfig() lease.Config {
	return lease.Config{Holder: w.cfg.ID, Host: hostName, Version: buildinfo.Read().String(), TTL: w.cfg.Topology.LeaseTTL, SafetyMargin: w.cfg.SafetyMargin, Logger: w.cfg.Logger, Renewed: w.leaseRenewed()}
}

// hostName is this machine's name, written into the worker's lease
// entries for the console ("" when the system will not say).
var hostName, _ = os.Hostname()

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
