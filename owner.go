package keylane

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// owner runs one partition for as long as this worker holds its lease.
//
// On taking the lease it deletes and re-creates the partition's durable
// consumer: jobs the previous owner fetched but never acked are delivered
// again at once, in stream order, instead of after AckWait. A paused former
// owner cannot interfere: it stopped trusting its lease before ours was
// granted, so it neither acks nor replies, and anything it stored carries an
// older fence.
type owner struct {
	w   *Worker
	p   int
	l   *lease.Lease
	log *slog.Logger

	ctx    context.Context // handlers' context: dies on lease loss or abort
	cancel context.CancelFunc

	handoverOnce, abortOnce sync.Once
	handoverCh, abortCh     chan struct{}
	done                    chan struct{}

	orphan        bool          // taken because its desired owner did not claim it
	since         time.Time     // when the lease was taken
	prevDelivered uint64        // last stream sequence the previous consumer delivered
	maxAcked      atomic.Uint64 // highest stream sequence acked
	ln            *lanes        // the lanes of the current consumer generation
}

// How long a handed-back job stays with the server before it is delivered
// again: while its key is stalled, long enough that the redeliveries (which
// the server sends before new messages) leave room for the other keys;
// once the key recovered and only waits for a lower job to return, short.
const (
	stalledHandBackDelay = time.Second
	turnHandBackDelay    = 100 * time.Millisecond
)

// handBack returns a fetched job to the server for later delivery, without
// running it: NAK with a delay. The server keeps it pending (it still
// counts against MaxPending), but this worker's memory and MaxInFlight do
// not hold it.
func (o *owner) handBack(t *task, stalled bool) {
	o.w.stats.handedBack.Add(1)
	d := turnHandBackDelay
	if stalled {
		d = stalledHandBackDelay
	}
	if err := t.msg.NakWithDelay(d); err != nil {
		o.log.Debug("hand back", "job_id", t.job.ID, "err", err)
	}
}

func newOwner(w *Worker, p int, l *lease.Lease) *owner {
	o := &owner{
		w: w, p: p, l: l,
		handoverCh: make(chan struct{}), abortCh: make(chan struct{}), done: make(chan struct{}),
	}
	o.log = w.log.With("partition", p, "fence", l.Fence())
	o.ctx, o.cancel = context.WithCancel(context.Background())
	return o
}

// handOver asks the owner to finish what it fetched and release the lease.
func (o *owner) handOver() { o.handoverOnce.Do(func() { close(o.handoverCh) }) }

// abort asks the owner to stop now: cancel handlers, drop queued jobs.
func (o *owner) abort() { o.abortOnce.Do(func() { close(o.abortCh) }) }

func (o *owner) run() {
	defer close(o.done)
	defer o.cancel()
	o.w.stats.owned.Add(1)
	defer o.w.stats.owned.Add(-1)
	o.log.Info("partition acquired")

	group, run := 1, func(ts []*task) { o.process(ts[0]) }
	if o.w.cfg.Reducer != nil {
		group, run = maxGroup, o.runGroup
	}
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
				t := time.NewTimer(releaseHold)
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
		ln := newLanes(o.w.cfg.Concurrency, group, run)
		o.ln = ln
		why := o.fetch(cons, ln)
		if why == nil {
			ln.close(o.ctx.Err() != nil)
			break
		}
		// Re-synchronise: what was queued here is dropped (the new
		// consumer delivers it again, in order, from the ack floor); what
		// is running finishes and acks first.
		ln.close(true)
		o.w.stats.resyncs.Add(1)
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

// openConsumer re-creates the partition's consumer (resetConsumer). A
// failure that waiting may cure (a request lost in a Raft election, a
// stream or consumer without a leader, a connection down) is retried with
// backoff for as long as the tenure lasts: each attempt is bounded by
// consumerAttempt, so the partition resumes within moments of the
// stream's new leader, and the lease stays with this owner meanwhile (its
// watchdog renews it if the leases bucket answers; if not, the lease
// lapses and the tenure ends). A replaced or missing stream is returned at
// once.
func (o *owner) openConsumer(pause *resyncBackoff) (jetstream.Consumer, error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		cons, err := o.resetConsumer()
		if err == nil && attempt > 1 {
			o.log.Info("partition consumer ready", "attempts", attempt, "took", time.Since(start).Round(time.Millisecond))
		}
		if err == nil || !transient(err) {
			return cons, err
		}
		if attempt == 1 || attempt%10 == 0 {
			o.log.Warn("partition consumer not ready; retrying", "attempt", attempt, "err", err)
		}
		if !pause.wait(o.ctx, o.abortCh, o.handoverCh, o.l.Done()) {
			return nil, err
		}
	}
}

// transient reports whether a failed request may succeed if asked again:
// a timeout, no responders or no leader (a Raft election), a connection
// being re-established.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, errTopologyChanged),
		errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, nats.ErrConnectionClosed):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected):
		return true
	case errors.As(err, &apiErr):
		// 503: JetStream or the asset's group has no leader right now.
		return apiErr.Code == 503
	}
	return false
}

// resyncBackoff spaces out re-synchronisations (and consumer re-creation
// attempts) of one tenure: 20ms after the first, doubling to at most
// resyncMaxPause while they follow each other closely.
type resyncBackoff struct {
	next time.Duration
	last time.Time
}

// wait sleeps before the next re-synchronisation; it reports false if the
// tenure ended first.
func (b *resyncBackoff) wait(ctx context.Context, abort, handover, lost <-chan struct{}) bool {
	if b.next == 0 || time.Since(b.last) > resyncCalm {
		b.next = 20 * time.Millisecond
	}
	t := time.NewTimer(b.next)
	defer t.Stop()
	b.next = min(2*b.next, resyncMaxPause)
	defer func() { b.last = time.Now() }()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-abort:
	case <-handover:
	case <-lost:
	}
	return false
}

// resyncMaxPause caps the pause between re-synchronisations, and
// consumerAttempt bounds one attempt to re-create the consumer: a request
// lost in an election is asked again, not waited out.
const (
	resyncMaxPause  = time.Second
	consumerAttempt = 2 * time.Second
	// consumerLeaderWait bounds the wait for a new replicated consumer's
	// first leader within one attempt. A new group elects its preferred
	// peer at once; the server may prefer a peer that died moments ago
	// (it learns of a SIGKILLed node only after missed heartbeats), and
	// then the group waits an election timeout (4-9s). Re-creating the
	// consumer draws another preferred peer, so the attempt gives up early.
	consumerLeaderWait = 2 * time.Second
	// consumerInfoWait bounds the old consumer's info: its leader answers
	// in milliseconds, and without one the owner does not wait for it.
	consumerInfoWait = 500 * time.Millisecond
)

// pullExpiry is how long one pull request lives; the server heartbeats
// every half of it and a missed pair re-synchronises the partition.
const pullExpiry = 5 * time.Second

// errTopologyChanged is why an owner does not consume a replaced stream.
var errTopologyChanged = errors.New("the jobs stream was replaced (repartition): reloading the topology")

// errDeliveryGap and errReconnected say why a partition re-synchronises.
var (
	errDeliveryGap = errors.New("a delivery never reached this worker (gap in the consumer's delivery sequence)")
	errReconnected = errors.New("the connection to the server was re-established")
)

// fetch pulls the partition's jobs into ln until the tenure ends (lease
// loss, abort, hand-over: it returns nil) or the delivery can no longer be
// trusted to be gap-free: a delivery sequence skipped (another puller, a
// message lost with a connection or a consumer leader), a reconnect, or
// missed heartbeats. Then it returns why, having dispatched nothing after
// the gap, and the caller re-creates the consumer.
func (o *owner) fetch(cons jetstream.Consumer, ln *lanes) error {
	batch := min(o.w.cfg.MaxInFlight, 256)
	// A short pull expiry means heartbeats every PullExpiry/2: a pull
	// request lost with a consumer leader (a cluster) or a connection is
	// noticed in seconds and re-synchronised, not at a 30s expiry.
	it, err := cons.Messages(jetstream.PullMaxMessages(batch), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		// Treat it like a broken delivery: try again after a pause.
		return fmt.Errorf("fetch: %w", err)
	}
	status := o.w.nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	defer o.w.nc.RemoveStatusListener(status)

	var resync atomic.Pointer[error]
	stopCh := make(chan struct{})
	var ctl sync.WaitGroup
	ctl.Add(2)
	go func() { // the controller: turns lease loss, hand-over, abort and reconnects into iterator stops
		defer ctl.Done()
		for {
			select {
			case <-o.l.Done():
				o.cancel()
				it.Stop()
				ln.wake()
				return
			case <-o.abortCh:
				o.cancel()
				it.Stop()
				ln.wake()
				return
			case st := <-status:
				if st == nats.CONNECTED {
					err := errReconnected
					resync.CompareAndSwap(nil, &err)
					it.Stop()
					ln.wake()
					return
				}
			case <-o.handoverCh:
				it.Drain()
				ln.wake()
				// A hand-over can still turn into loss or abort while draining.
				select {
				case <-o.l.Done():
					o.cancel()
				case <-o.abortCh:
					o.cancel()
				case <-stopCh:
				}
				return
			case <-stopCh:
				return
			}
		}
	}()
	go func() { // keeps waiting and long-running jobs from being redelivered
		defer ctl.Done()
		every := o.w.cfg.AckWait / 3
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stopCh:
				return
			case <-t.C:
				if o.l.Trusted() {
					ln.touch(every, func(t *task) { _ = t.msg.InProgress() })
				}
			}
		}
	}()

	var delivered uint64 // the consumer's last delivery sequence seen
	for {
		// Hold at most MaxInFlight jobs in memory; the server's window
		// (MaxPending) is larger, so jobs a stalled key hands back do not
		// stop the others.
		ln.waitRoom(o.w.cfg.MaxInFlight)
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			break
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			o.log.Warn("partition consumer deleted under us; stepping down", "err", err)
			o.abort()
			continue
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			resync.CompareAndSwap(nil, &err)
			it.Stop()
			ln.wake()
			continue
		}
		if err != nil {
			// Anything else the iterator reports (a closed connection, a
			// failed pull) is met with a re-sync, which the tenure spaces
			// out with backoff: never a loop that retries at once.
			o.log.Debug("partition fetch", "err", err)
			fetchErr := fmt.Errorf("fetch: %w", err)
			resync.CompareAndSwap(nil, &fetchErr)
			it.Stop()
			ln.wake()
			continue
		}
		if resync.Load() != nil {
			continue // nothing after a gap may run before the re-sync
		}
		if meta, err := msg.Metadata(); err == nil {
			if meta.Sequence.Consumer != delivered+1 {
				gap := fmt.Errorf("%w: delivery %d after %d (stream seq %d)", errDeliveryGap, meta.Sequence.Consumer, delivered, meta.Sequence.Stream)
				resync.CompareAndSwap(nil, &gap)
				it.Stop()
				ln.wake()
				continue
			}
			delivered = meta.Sequence.Consumer
		}
		o.dispatch(ln, msg)
	}
	close(stopCh)
	ctl.Wait()
	if why := resync.Load(); why != nil && o.ctx.Err() == nil && !isClosed(o.abortCh) && !isClosed(o.handoverCh) {
		return *why
	}
	return nil
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
func (o *owner) settle(cons jetstream.Consumer) {
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
	if !settleAcks(o.w.topo.StreamOf(o.p), cons, want, stop.Done(), o.w.cfg.AckWait) {
		o.log.Warn("hand-over: acks not applied before the drain ended", "want", want)
	}
}

// settleAcks waits until the ack of stream sequence want is applied; it
// reports false if stop closed or limit passed first.
func settleAcks(stream jetstream.Stream, cons jetstream.Consumer, want uint64, stop <-chan struct{}, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	pause := 2 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
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

func (o *owner) release() {
	ctx, cancel := context.WithTimeout(context.Background(), o.w.cfg.Topology.LeaseTTL)
	defer cancel()
	err := o.l.Release(ctx)
	switch {
	case errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrExpired):
		o.w.stats.lost.Add(1)
		o.log.Warn("partition lease lost", "err", err)
	case err != nil:
		o.log.Warn("partition release", "err", err)
	default:
		o.w.stats.released.Add(1)
		o.log.Info("partition released")
	}
}

func (o *owner) resetConsumer() (jetstream.Consumer, error) {
	// Each request gets its own consumerAttempt: a request lost in an
	// election fails the attempt quickly, and openConsumer asks again.
	req := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(o.ctx, consumerAttempt)
	}
	topo := o.w.topo
	jobs := topo.StreamOf(o.p)
	// Never consume a jobs stream of another epoch than this worker's
	// topology (a repartition replaced it, or the shard was created
	// again): the worker reloads first.
	ctx, cancel := req()
	info, err := jobs.Info(ctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("jobs stream: %w", err)
	}
	if meta, err := readMeta(info, 0); err != nil || meta.Epoch != topo.EpochOf(o.p) {
		o.w.requestReload()
		return nil, errTopologyChanged
	}
	name := topo.Names.Consumer(o.p)
	// A consumer with a leader answers its info at once; one without is
	// not waited for (see the transient case below).
	ctx, cancel = context.WithTimeout(o.ctx, consumerInfoWait)
	old, err := jobs.Consumer(ctx, name)
	cancel()
	switch {
	case err == nil:
		info := old.CachedInfo()
		// Carry the mark across generations: an owner that handed over
		// before anything reached it must not hide what its predecessor
		// had delivered.
		inherited, _ := strconv.ParseUint(info.Config.Metadata[metaDelivered], 10, 64)
		o.prevDelivered = max(o.prevDelivered, info.Delivered.Stream, inherited)
		if err := o.deleteConsumer(name); err != nil {
			return nil, err
		}
	case errors.Is(err, jetstream.ErrConsumerNotFound):
	case transient(err):
		// The old consumer does not answer: its leader was lost and its
		// group is still electing one (up to 9s). Its delivered mark is
		// unknown, so take the stream's last sequence once the consumer is
		// gone: nothing it delivered lies above that, and every job up to
		// it is treated as maybe delivered before (checked against held
		// outcomes and stored results), which costs lookups, not safety.
		if err := o.deleteConsumer(name); err != nil {
			return nil, err
		}
		ctx, cancel = req()
		info, err := jobs.Info(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("jobs stream: %w", err)
		}
		o.prevDelivered = max(o.prevDelivered, info.State.LastSeq)
	default:
		return nil, fmt.Errorf("old consumer: %w", err)
	}
	cfg := topo.consumerConfig(o.p, o.w.cfg.AckWait, o.w.cfg.MaxPending)
	cfg.Metadata = map[string]string{metaDelivered: strconv.FormatUint(o.prevDelivered, 10)}
	ctx, cancel = req()
	cons, err := jobs.CreateOrUpdateConsumer(ctx, cfg)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	if topo.Replicas < 2 {
		return cons, nil
	}
	// A replicated consumer answers pulls only once it has a leader; a
	// pull sent before is lost until it expires.
	wait, cancelWait := context.WithTimeout(o.ctx, consumerLeaderWait)
	defer cancelWait()
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		ctx, cancel := context.WithTimeout(wait, consumerAttempt)
		info, err := cons.Info(ctx)
		cancel()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
			return cons, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-wait.Done():
			t.Stop()
			return nil, fmt.Errorf("consumer %s has no leader: %w", name, wait.Err())
		case <-t.C:
		}
	}
}

// deleteConsumer deletes the partition's consumer (a meta request: it
// needs no leader of the consumer's own group). Gone already is success.
func (o *owner) deleteConsumer(name string) error {
	ctx, cancel := context.WithTimeout(o.ctx, consumerAttempt)
	defer cancel()
	if err := o.w.topo.StreamOf(o.p).DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete old consumer: %w", err)
	}
	return nil
}

// metaDelivered is the consumer metadata key that records the highest
// stream sequence any earlier consumer of the partition had delivered.
const metaDelivered = "keylane.delivered-before"

// dispatch validates a fetched message and queues it in its key's lane.
// Anything that is not a valid job of this partition is dead-lettered and
// acked, never handed to the handler and never allowed to stop the loop.
func (o *owner) dispatch(ln *lanes, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		o.malformed(msg, 0, fmt.Errorf("no JetStream metadata: %w", err))
		return
	}
	h := msg.Headers()
	key := h.Get(HeaderKey)
	if err := partition.ValidateKey(key); err != nil {
		o.malformed(msg, meta.Sequence.Stream, fmt.Errorf("bad %s header: %w", HeaderKey, err))
		return
	}
	if p := partition.Of(key, o.w.topo.Partitions); p != o.p {
		o.malformed(msg, meta.Sequence.Stream, fmt.Errorf("key %q belongs to partition %d, arrived on %d", key, p, o.p))
		return
	}
	if n := h.Get(HeaderPartitions); n != "" && n != o.w.topo.nHeader {
		o.malformed(msg, meta.Sequence.Stream, fmt.Errorf("routed by a client that counts %s partitions, the jobs stream has %d: re-open the client", n, o.w.topo.Partitions))
		return
	}
	if reply := h.Get(HeaderReply); reply != "" && !validReply(reply, o.w.topo.Meta.ReplyPrefix) {
		o.malformed(msg, meta.Sequence.Stream, fmt.Errorf("reply subject %q is not under the reply prefix %q", reply, o.w.topo.Meta.ReplyPrefix))
		return
	}
	id := h.Get(HeaderJobID)
	if id == "" {
		id = syntheticIDPrefix + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	t := &task{msg: msg, maybeDup: meta.NumDelivered > 1 || meta.Sequence.Stream <= o.prevDelivered, explicit: h.Get(HeaderIdempotent) != "", keep: h.Get(HeaderKeepOutcome) != ""}
	t.job = Job{
		ID: id, Key: key, Type: h.Get(HeaderType), Payload: msg.Data(), Partition: o.p,
		Seq: meta.Sequence.Stream, Fence: o.l.Fence(), Headers: h,
	}
	if _, back, stalled := ln.addTo(t); back {
		o.handBack(t, stalled)
	}
}

func (o *owner) malformed(msg jetstream.Msg, seq uint64, why error) {
	o.w.stats.malformed.Add(1)
	o.log.Warn("malformed message dead-lettered", "seq", seq, "err", why)
	err := Permanent(fmt.Errorf("malformed: %w", why))
	if !o.deadLetter(msg, Job{Seq: seq, Partition: o.p, Fence: o.l.Fence()}, err, 0) || !o.l.Trusted() {
		return
	}
	// Tell a caller waiting on a proper reply subject why, then ack.
	if reply := msg.Headers().Get(HeaderReply); reply != "" && validReply(reply, o.w.topo.Meta.ReplyPrefix) {
		if perr := o.w.nc.PublishMsg(replyMsg(reply, nil, err, true)); perr != nil {
			o.log.Warn("reply", "seq", seq, "err", perr)
		}
	}
	_ = msg.Ack()
}

// maxGroup bounds how many queued jobs of one key a runner takes at once
// to group-commit.
const maxGroup = 256

// runGroup runs queued jobs of one key, in order, through the reducer,
// committing them in groups (see State.group), then replies to and acks
// each. Jobs that may have run before under an earlier owner, jobs whose
// reduce failed and groups whose write failed go through process, one at
// a time, with its retries, backoff and dead-lettering.
func (o *owner) runGroup(ts []*task) {
	jobs := make([]Job, len(ts))
	out := make([][]byte, len(ts))
	for len(ts) > 0 {
		if o.ctx.Err() != nil {
			o.w.stats.unacked.Add(int64(len(ts)))
			return
		}
		if ts[0].maybeDup {
			o.ln.requeue(ts[0].job.Key, ts[1:]) // process may retry: let a stall see the rest
			o.process(ts[0])
			return
		}
		k := 1
		for k < len(ts) && !ts[k].maybeDup {
			k++
		}
		// Jobs with a caller's ID may be retries of jobs that finished
		// long ago: one concurrent look-up of their kept outcomes.
		if i := o.firstKept(ts[:k]); i == 0 {
			o.w.stats.fromResults.Add(1)
			o.finish(ts[0], ts[0].kept.res, ts[0].kept.err, false)
			ts = ts[1:]
			continue
		} else if i > 0 {
			k = i
		}
		g := ts[:k]
		for i, t := range g {
			t.job.Attempt = 1
			jobs[i] = t.job
		}
		n, rerr, werr := o.applyGroup(jobs[:k], out[:k])
		if errors.Is(werr, ErrStaleFence) {
			o.w.stats.stale.Add(1)
			o.log.Warn("stale fence: a newer owner wrote this key; stepping down", "key", g[0].job.Key, "err", werr)
			o.abort()
			return
		}
		if werr != nil {
			// Unknown outcome, or another writer: settle each job alone;
			// a re-read tells which ones the write covered.
			// The head goes through the one-job path (re-read, retries with
			// backoff); the rest go back to the lane and are grouped again
			// after a re-read, which settles those the write covered.
			o.log.Warn("group commit failed; settling the head alone", "key", g[0].job.Key, "jobs", k, "err", werr)
			o.ln.requeue(ts[0].job.Key, ts[1:])
			o.process(ts[0])
			return
		}
		if !o.keepOutcomes(g[:n], out[:n]) {
			o.w.stats.unacked.Add(int64(n))
			ts = ts[n:]
			continue
		}
		for i := range n {
			if o.finish(g[i], out[i], nil, false) {
				o.w.stats.succeeded.Add(1)
			}
			out[i] = nil
		}
		ts = ts[n:]
		if n < k && (rerr != nil || n == 0) {
			ts[0].firstErr = rerr
			o.ln.requeue(ts[0].job.Key, ts[1:]) // process retries: let a stall see the rest
			o.process(ts[0])
			return
		}
	}
}

// process runs one job to completion: handler, in-place retries with
// backoff, dead-lettering, result, reply and ack.
func (o *owner) process(t *task) {
	if o.ctx.Err() != nil {
		return
	}
	if t.explicit || t.maybeDup && o.w.cfg.StoreResults {
		// A job the caller may retry by ID (or a redelivery) that finished
		// before is answered from its kept outcome.
		if res, rerr, ok := o.storedResult(t.job.ID); ok {
			o.w.stats.fromResults.Add(1)
			o.finish(t, res, rerr, false)
			return
		}
	}
	first := 1
	if t.maybeDup {
		// The job may have taken its previous owner down with it. Count
		// such starts across owners so a job that crashes every worker that
		// runs it is dead-lettered instead of blocking its key forever. The
		// first run is not counted (that would cost every job a round
		// trip), so such a job runs at most MaxDeliver+1 times.
		n, err := o.countStart(t.job.ID)
		if err != nil {
			o.log.Warn("count restarts", "job_id", t.job.ID, "err", err)
		}
		first = n + 1
		if first > o.w.cfg.MaxDeliver {
			err := fmt.Errorf("keylane: job restarted %d times by new owners without finishing: its workers crashed or lost their leases", n)
			o.w.stats.failed.Add(1)
			if o.deadLetter(t.msg, t.job, err, n) {
				o.finish(t, nil, Permanent(err), true)
			}
			return
		}
	}
	stalled := false
	for attempt := first; ; attempt++ {
		t.job.Attempt = attempt
		var res []byte
		var err error
		if attempt == first && t.firstErr != nil {
			// A group already ran this attempt.
			err, t.firstErr = t.firstErr, nil
		} else {
			res, err = o.call(t.job)
		}
		if o.ctx.Err() != nil {
			o.w.stats.unacked.Add(1)
			return
		}
		if err == nil {
			if o.finish(t, res, nil, false) {
				o.w.stats.succeeded.Add(1)
			}
			return
		}
		if errors.Is(err, ErrStaleFence) {
			o.w.stats.stale.Add(1)
			o.log.Warn("stale fence: a newer owner wrote this key; stepping down", "job_id", t.job.ID, "err", err)
			o.abort()
			return
		}
		if errors.Is(err, ErrGap) {
			// Later jobs of the key were applied and this one never was: it
			// can no longer run in order. Say so loudly and to its caller.
			o.w.stats.gaps.Add(1)
			o.w.stats.failed.Add(1)
			o.log.Error("job skipped by a later job of its key; dead-lettering it", "job_id", t.job.ID, "seq", t.job.Seq, "err", err)
			err = Permanent(err)
			if o.deadLetter(t.msg, t.job, err, attempt) {
				o.finish(t, nil, err, true)
			}
			return
		}
		if errors.Is(err, ErrEpoch) {
			// The key's state belongs to another jobs stream. Nothing runs
			// until an operator adopts it; keep the job, and look again.
			o.log.Error("key's state was written under another jobs stream; holding the job until its epoch is adopted", "job_id", t.job.ID, "err", err)
			o.w.refreshEpoch(o.ctx)
			attempt-- // not the job's fault: never dead-lettered for it
		} else {
			o.w.stats.failed.Add(1)
			if errors.Is(err, ErrPermanent) || attempt >= o.w.cfg.MaxDeliver {
				if o.deadLetter(t.msg, t.job, err, attempt) {
					o.finish(t, nil, err, true)
				}
				return
			}
			o.log.Warn("job failed; retrying", "job_id", t.job.ID, "attempt", attempt, "err", err)
		}
		if !stalled {
			// Keep a few of the key's queued jobs; hand the rest back so
			// they do not hold the partition's window while this retries.
			stalled = true
			defer o.ln.stall(t.job.Key, false)
			for _, bt := range o.ln.stall(t.job.Key, true) {
				o.handBack(bt, true)
			}
		}
		timer := time.NewTimer(o.w.cfg.Backoff(max(attempt, 1)))
		select {
		case <-timer.C:
		case <-o.ctx.Done():
			timer.Stop()
			o.w.stats.unacked.Add(1)
			return
		}
	}
}

// startsKey is the results-bucket key counting a redelivered job's starts.
// '/' never occurs in a job ID, so it cannot collide with a stored result.
// The results bucket has a TTL, so a counter (and the purge marker that
// forgetting it leaves) expires with it instead of staying for ever, as it
// did in the TTL-less state bucket.
func startsKey(jobID string) string {
	return "starts/" + base64.RawURLEncoding.EncodeToString([]byte(jobID))
}

// countStart records one more start of a possibly redelivered job and
// returns how many starts were recorded before this one (under earlier
// owners). Only redelivered jobs pay this round trip.
func (o *owner) countStart(jobID string) (int, error) {
	ctx, cancel := context.WithTimeout(o.ctx, counterTimeout)
	defer cancel()
	kv, k := o.w.topo.Results, startsKey(jobID)
	var n int
	err := casLoop(ctx, func(bool) error {
		n = 0
		var rev uint64
		e, err := kv.Get(ctx, k)
		switch {
		case err == nil:
			n, _ = strconv.Atoi(string(e.Value()))
			rev = e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		default:
			return err
		}
		_, err = casPut(ctx, kv, k, rev, []byte(strconv.Itoa(n+1)))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("keylane: restart counter: %w", err)
	}
	return n, nil
}

// forgetStarts drops a finished job's start counter. It runs only once the
// job was acked here; a crash leaves the counter for the next owner.
func (o *owner) forgetStarts(jobID string) {
	ctx, cancel := context.WithTimeout(context.Background(), counterTimeout)
	defer cancel()
	_ = o.w.topo.Results.Purge(ctx, startsKey(jobID))
}

func (o *owner) call(job Job) (res []byte, err error) {
	if o.w.cfg.Reducer != nil {
		return o.reduceOne(job)
	}
	o.w.stats.runs.Add(1)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylane: handler panicked: %v", r)
		}
	}()
	return o.w.cfg.Handler.Handle(o.ctx, job)
}

// finish stores the result, replies and acks, all only while the lease is
// trusted. It reports whether it acked.
func (o *owner) finish(t *task, res []byte, herr error, dead bool) bool {
	if !o.l.Trusted() {
		o.w.stats.unacked.Add(1)
		return false
	}
	if !t.outcomeKept {
		// Kept before the reply and the ack: a retry by ID must find it.
		if !o.keepEncoded([]*task{t}, func(int) []byte { return encodeResult(res, herr, dead) }) {
			o.w.stats.unacked.Add(1)
			return false
		}
	}
	if reply := t.msg.Headers().Get(HeaderReply); reply != "" {
		m := replyMsg(reply, res, herr, dead)
		if !o.l.Trusted() {
			o.w.stats.unacked.Add(1)
			return false
		}
		if err := o.w.nc.PublishMsg(m); err != nil {
			o.log.Warn("reply", "job_id", t.job.ID, "err", err)
		}
	}
	if !o.l.Trusted() {
		o.w.stats.unacked.Add(1)
		return false
	}
	if err := t.msg.Ack(); err != nil {
		o.log.Warn("ack", "job_id", t.job.ID, "err", err)
		return false
	}
	if t.maybeDup {
		o.forgetStarts(t.job.ID)
	}
	for {
		cur := o.maxAcked.Load()
		if t.job.Seq <= cur || o.maxAcked.CompareAndSwap(cur, t.job.Seq) {
			break
		}
	}
	return true
}

// Dead letters always fit: the error text is cut to deadErrorMax bytes,
// and a dead letter that would still exceed the server's max_payload (a
// job published near the limit by something other than Client, which
// leaves DeadLetterReserve free) keeps its headers and drops the payload,
// saying how long it was.
const (
	deadErrorMax = 1024
	// DeadLetterReserve is the room Client leaves below max_payload in every
	// job for what a dead letter adds (headers naming the error, attempts,
	// worker, sequence, partition and fence).
	DeadLetterReserve = 2048
)

// deadLetter stores the job, with why it failed, on the dead-letter stream.
// A failed write is retried with backoff for as long as the lease is
// trusted, and counted and logged: the lane never moves past a job that
// was neither applied nor dead-lettered. It reports whether the dead letter
// was stored (only then may the job be acked); false means the tenure
// ended first and the job goes to the next owner.
func (o *owner) deadLetter(msg jetstream.Msg, job Job, why error, attempts int) bool {
	dm := o.deadMessage(msg, job, why, attempts)
	for try := 1; ; try++ {
		if !o.l.Trusted() || o.ctx.Err() != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(o.ctx, deadLetterTimeout)
		_, err := o.w.js.PublishMsg(ctx, dm)
		cancel()
		if err == nil {
			break
		}
		o.w.stats.deadErrors.Add(1)
		o.log.Error("dead-letter write failed; the job stays in its lane until one succeeds", "job_id", job.ID, "try", try, "err", err)
		timer := time.NewTimer(o.w.cfg.Backoff(try))
		select {
		case <-timer.C:
		case <-o.ctx.Done():
			timer.Stop()
			return false
		}
	}
	o.w.stats.dead.Add(1)
	o.log.Warn("job dead-lettered", "job_id", job.ID, "attempts", attempts, "err", why)
	return true
}

// deadLetterTimeout bounds one write to the dead-letter stream.
const deadLetterTimeout = 5 * time.Second

// deadMessage builds the dead letter of msg: its headers and payload plus
// why it failed, bounded to fit the server's max_payload.
func (o *owner) deadMessage(msg jetstream.Msg, job Job, why error, attempts int) *nats.Msg {
	dm := nats.NewMsg(partition.DeadSubject(o.w.topo.Names.Namespace, o.p))
	for k, vs := range msg.Headers() {
		// Publish expectations (Nats-Expected-Stream, …) were meant for the
		// jobs stream and would make the dead-letter publish fail.
		if strings.HasPrefix(k, "Nats-Expected-") {
			continue
		}
		dm.Header[k] = append([]string(nil), vs...)
	}
	dm.Header.Del(HeaderReply)
	text := why.Error()
	if len(text) > deadErrorMax {
		text = strings.ToValidUTF8(text[:deadErrorMax], "") + "…"
	}
	dm.Header.Set(HeaderError, text)
	dm.Header.Set(HeaderAttempts, strconv.Itoa(attempts))
	dm.Header.Set(HeaderWorker, o.w.cfg.ID)
	dm.Header.Set(HeaderSeq, strconv.FormatUint(job.Seq, 10))
	dm.Header.Set(HeaderPartition, strconv.Itoa(o.p))
	dm.Header.Set(HeaderFence, strconv.FormatUint(o.l.Fence(), 10))
	dm.Data = msg.Data()
	if size := messageSize(dm); size > o.w.nc.MaxPayload() {
		dm.Header.Set(HeaderPayloadDropped, strconv.Itoa(len(dm.Data)))
		dm.Data = nil
		// Headers of a foreign message may be huge too: keep ours only.
		if messageSize(dm) > o.w.nc.MaxPayload() {
			for k := range dm.Header {
				if !strings.HasPrefix(k, "Keylane-") && k != HeaderJobID {
					delete(dm.Header, k)
				}
			}
			if key := dm.Header.Get(HeaderKey); len(key) > partition.MaxKeyLen {
				dm.Header.Del(HeaderKey)
			}
		}
	}
	return dm
}

// messageSize is roughly what a message takes against max_payload.
func messageSize(m *nats.Msg) int64 {
	n := len(m.Data) + len(m.Subject) + 64
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

func (o *owner) storedResult(id string) ([]byte, error, bool) {
	if ValidateJobID(id) != nil {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(o.ctx, resultLookupTimeout)
	defer cancel()
	e, err := o.w.topo.Results.Get(ctx, id)
	if err != nil {
		return nil, nil, false
	}
	res, rerr, ok := decodeResult(e.Value())
	return res, rerr, ok
}

// firstKept looks up, concurrently, the kept outcomes of the tasks whose ID
// the caller chose, and returns the index of the first task that has one
// (an earlier run of the same job ID finished), or -1.
func (o *owner) firstKept(ts []*task) int {
	var wg sync.WaitGroup
	for _, t := range ts {
		if t.explicit {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if res, rerr, ok := o.storedResult(t.job.ID); ok {
					t.kept = &keptOutcome{res: res, err: rerr}
				}
			}()
		}
	}
	wg.Wait()
	for i, t := range ts {
		if t.kept != nil {
			return i
		}
	}
	return -1
}

// keepOutcomes stores, before anything is replied or acked, the outcomes of
// the settled tasks that need it (all with StoreResults, else those with a
// caller's ID or from a Call), as concurrent publishes to the results
// bucket waited on together. A failed batch (the bucket electing a leader)
// is tried again with backoff while the lease is trusted: the jobs are
// applied, and their callers wait for these outcomes. It reports false only
// when the tenure ended first; the jobs then stay unacked and are answered
// from the state entry when redelivered.
func (o *owner) keepOutcomes(ts []*task, out [][]byte) bool {
	return o.keepEncoded(ts, func(i int) []byte { return encodeResult(out[i], nil, false) })
}

// keepEncoded is keepOutcomes with each task's outcome already encoded.
func (o *owner) keepEncoded(ts []*task, value func(i int) []byte) bool {
	var idx []int
	for i, t := range ts {
		if o.w.cfg.StoreResults || t.explicit || t.keep {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return true
	}
	subject := "$KV." + o.w.topo.Names.Results() + "."
	for try := 1; ; try++ {
		if err := o.publishOutcomes(subject, ts, value, idx); err == nil {
			for _, i := range idx {
				ts[i].outcomeKept = true
			}
			return true
		} else {
			o.log.Warn("store results; trying again", "jobs", len(idx), "try", try, "err", err)
		}
		timer := time.NewTimer(o.w.cfg.Backoff(try))
		select {
		case <-timer.C:
		case <-o.ctx.Done():
			timer.Stop()
			return false
		}
		if !o.l.Trusted() {
			return false
		}
	}
}

// publishOutcomes publishes the outcomes of ts[idx] asynchronously and
// waits for every ack.
func (o *owner) publishOutcomes(subject string, ts []*task, value func(i int) []byte, idx []int) error {
	futures := make([]jetstream.PubAckFuture, 0, len(idx))
	for _, i := range idx {
		f, err := o.w.js.PublishAsync(subject+ts[i].job.ID, value(i))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(requestTimeout)
	defer timeout.Stop()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-timeout.C:
			return errors.New("no ack in time")
		case <-o.ctx.Done():
			return o.ctx.Err()
		}
	}
	return nil
}
