package tenure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"

	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pullExpiry is how long one pull request lives; the server heartbeats
// every half of it and a missed pair re-synchronises the partition.
const pullExpiry = 5 * time.Second

// pullNudge is how long fetch waits for a job before it asks the
// iterator again, with the missed-heartbeat watch, for as long as it
// takes. nats.go v1.55.0's pull iterator decides on a new pull only when
// Next is called, and skips it while the goroutine that sent the last
// pull has not yet marked it sent: with a small pull batch (MaxInFlight
// 1 or 2) and jobs waiting, the pull's job can arrive and be taken first,
// and the iterator then sits with no pull out until its missed-heartbeat
// error, 5 s later, which fetch must read as a broken delivery and
// re-synchronise (TestSmallWindowKeepsPulling). The second Next, after
// the nudge, makes the pull the first one skipped; waiting idleCheck, far
// longer than nats.go's heartbeat watch, it keeps that watch, which a Next
// that returns every pullNudge would restart each time and never fire.
const pullNudge = 100 * time.Millisecond

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
func (o *Owner) fetch(cons jetstream.Consumer, ln *lanes) error {
	batch := min(o.cfg.MaxInFlight, 256)
	// A short pull expiry means heartbeats every PullExpiry/2: a pull
	// request lost with a consumer leader (a cluster) or a connection is
	// noticed in seconds and re-synchronised, not at a 30s expiry.
	it, err := cons.Messages(jetstream.PullMaxMessages(batch), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		// Treat it like a broken delivery: try again after a pause.
		return fmt.Errorf("fetch: %w", err)
	}
	status := o.nc.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	defer o.nc.RemoveStatusListener(status)

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
		every := o.cfg.AckWait / 3
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
	// newest is the highest stream sequence delivered; a gap's missing
	// deliveries lie between it and the delivery that showed the gap.
	var newest, gapFrom, gapTo uint64
	for {
		// Hold at most MaxInFlight jobs in memory (the lanes' window); the
		// server's window (MaxPending) is larger, so jobs a stalled key
		// hands back do not stop the others.
		back, stalledBack := ln.waitRoom()
		for _, t := range back {
			o.handBack(t, false)
		}
		for _, t := range stalledBack {
			o.handBack(t, true)
		}
		msg, err := it.Next(jetstream.NextMaxWait(pullNudge))
		if errors.Is(err, nats.ErrTimeout) {
			msg, err = it.Next(jetstream.NextMaxWait(o.idleCheck()))
		}
		if errors.Is(err, nats.ErrTimeout) {
			// Nothing came for a while. A delivery nats.go swallowed as a
			// status, with no later one to show the gap (the partition's
			// last job), or a delivery lost, shows only in what the server
			// says it delivered (unseenDeliveries).
			from, to, unseen := o.unseenDeliveries(cons, delivered)
			if unseen == nil {
				continue
			}
			// A delivery on its way has its moment to arrive.
			msg, err = it.Next(jetstream.NextMaxWait(unseenGrace))
			if errors.Is(err, nats.ErrTimeout) {
				if resync.CompareAndSwap(nil, &unseen) {
					gapFrom, gapTo = from, to
				}
				it.Stop()
				ln.wake()
				continue
			}
		}
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
			if c := meta.Sequence.Consumer; c > delivered+1 && meta.NumDelivered == 1 && meta.Sequence.Stream > newest+1 &&
				o.removeSwallowed(newest+1, meta.Sequence.Stream-1, c-delivered-1) {
				// Every missing delivery was a message nats.go swallowed as
				// a status, now dead-lettered and removed: no job was lost,
				// so no re-synchronisation (see undeliverable.go).
				delivered = c - 1
			}
			if meta.Sequence.Consumer != delivered+1 {
				gap := fmt.Errorf("%w: delivery %d after %d (stream seq %d)", errDeliveryGap, meta.Sequence.Consumer, delivered, meta.Sequence.Stream)
				if resync.CompareAndSwap(nil, &gap) && meta.Sequence.Stream > newest+1 {
					gapFrom, gapTo = newest+1, meta.Sequence.Stream-1
				}
				it.Stop()
				ln.wake()
				continue
			}
			delivered = meta.Sequence.Consumer
			newest = max(newest, meta.Sequence.Stream)
			o.noteDelivery(newest, meta.NumPending)
		}
		o.dispatch(ln, msg)
	}
	close(stopCh)
	ctl.Wait()
	if resync.Load() != nil && o.ctx.Err() == nil {
		// A message nats.go swallows as a status leaves a gap, or ends the
		// pull with an error, each time it is delivered: remove it before
		// re-synchronising (see undeliverable.go). Behind a gap it lies
		// before the delivery that showed the gap; otherwise it is the
		// next of the partition's jobs after the newest delivered.
		from, to, most := newest+1, uint64(math.MaxUint64), undeliverableAhead
		if gapTo != 0 {
			from, to, most = gapFrom, gapTo, undeliverableScan
		}
		if n := o.clearUndeliverable(from, to, most); n > 0 {
			o.log.Warn("undeliverable messages removed before re-synchronising", "count", n)
		}
	}
	if why := resync.Load(); why != nil && o.ctx.Err() == nil && !isClosed(o.abortCh) && !isClosed(o.handoverCh) {
		return *why
	}
	return nil
}

// idleCheck is how long the fetch loop waits for a message before it
// asks the server what the partition's consumer delivered
// (unseenDeliveries): one request per idle partition per period. It is
// at least twice the pull expiry, so nats.go's missed-heartbeat watch
// (twice the heartbeat, half the expiry), which each Next restarts, fires
// within it; and at least AckWait, as a swallowed message comes again
// only that often.
func (o *Owner) idleCheck() time.Duration {
	return max(2*pullExpiry, o.cfg.AckWait)
}

// unseenGrace is how long a delivery the server reports made may take to
// arrive before it counts as never received.
const unseenGrace = time.Second

// unseenDeliveries asks the server, for an idle partition, whether its
// consumer delivered more than the fetch loop received (delivered, the
// last delivery sequence received). A message nats.go takes for a status
// (undeliverable.go) that is the partition's last job is swallowed, and
// again at each redelivery, with no later delivery to show the gap: it
// would stay stored, unacked and never dead-lettered, for as long as the
// partition has no other traffic (TestTrailingStatusLookalikeIsRemoved).
// It returns the gap as a re-sync's reason, with the stream sequences the
// unseen deliveries lie between (above the ack floor, up to the last
// delivered), where the loop's end looks for such messages; a nil gap
// when nothing is missing, or when the server cannot be asked (the next
// idle period asks again; the first failure of a streak is a warning).
func (o *Owner) unseenDeliveries(cons jetstream.Consumer, delivered uint64) (from, to uint64, gap error) {
	if o.ctx.Err() != nil || isClosed(o.handoverCh) || !o.l.Trusted() {
		return 0, 0, nil
	}
	ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
	info, err := cons.Info(ctx)
	cancel()
	if err != nil {
		// Warn once per streak of failures, not once per idle period.
		lvl := slog.LevelWarn
		if o.idleInfoFailing {
			lvl = slog.LevelDebug
		}
		o.idleInfoFailing = true
		o.log.Log(o.ctx, lvl, "partition consumer info while idle failed; a trailing delivery nats.go swallowed stays unseen until it answers", "err", err)
		return 0, 0, nil
	}
	o.idleInfoFailing = false
	if info.Delivered.Consumer <= delivered {
		return 0, 0, nil
	}
	return info.AckFloor.Stream + 1, info.Delivered.Stream, fmt.Errorf("%w: the server delivered up to %d (stream seq %d), the last received was %d, and none came for %s",
		errDeliveryGap, info.Delivered.Consumer, info.Delivered.Stream, delivered, o.idleCheck())
}

// dispatch validates a fetched message and queues its jobs in their
// keys' lanes. Every job travels in a batch message (dispatchBatch); the
// one message of another form a worker runs is a delayed job's due copy,
// which only a worker's schedule makes and the server marks as such
// (wire.Rules.Parse: Keylane-Delayed-Id proven by Nats-Scheduler and
// Nats-Stream-Source). Anything else, a one-job message of an earlier
// client or a raw publisher among it, or anything that is not a valid job
// of this partition, is dead-lettered with the reason and acked (its
// caller, on a valid reply subject, told), never handed to the handler
// and never allowed to stop the loop.
func (o *Owner) dispatch(ln *lanes, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		o.malformed(msg, 0, wire.Job{}, fmt.Errorf("no JetStream metadata: %w", err))
		return
	}
	if o.isSubmission(msg.Subject()) {
		o.moveDelayed(msg, meta)
		return
	}
	h := msg.Headers()
	if _, isBatch := h[wire.HeaderBatch]; isBatch {
		o.dispatchBatch(ln, msg, meta)
		return
	}
	f, err := o.rules().Parse(msg.Subject(), h)
	if err != nil {
		o.malformed(msg, meta.Sequence.Stream, f, err)
		return
	}
	if f.DueSeq == 0 {
		// Nothing of it is acted on: not its ID (no outcome is kept or
		// looked up under it), not a redrive's hint; only its caller, on a
		// reply subject under the reply prefix, is told, at once, so a
		// Call of an earlier client does not wait out its deadline.
		o.refuse(msg, meta.Sequence.Stream, f, errOneJobMessage)
		return
	}
	o.deleteDue(f.DueSeq)
	t := &task{msg: msg, maybeDup: meta.NumDelivered > 1 || meta.Sequence.Stream <= o.prevDelivered, explicit: f.Idempotent, keep: f.KeepOutcome}
	t.stored = meta.Timestamp
	t.job = core.Job{
		ID: f.ID, Key: f.Key, Type: f.Type, Payload: msg.Data(), Partition: o.p,
		Seq: meta.Sequence.Stream, Fence: o.l.Fence(), Headers: h,
	}
	o.logReceived(t, meta.NumDelivered)
	if _, back, stalled := ln.addTo(t); back {
		o.handBack(t, stalled)
	}
}

// errOneJobMessage is why a one-job message (no Keylane-Batch) that is no
// delayed job's due copy is dead-lettered unrun: every keylane client
// sends each job in a batch message, so it was stored by an earlier
// client (on a stream drained too early) or by a raw publisher. A dead
// letter of it can be redriven, as a batch of one, once checked.
var errOneJobMessage = errors.New("one-job message (no " + wire.HeaderBatch + " header): this keylane runs only jobs sent in batch messages, every job a keylane client sends since the one message format; refused unrun (stored by an earlier client or a raw publisher: redrive the dead letter to run it)")

// dispatchBatch splits a batch message into its jobs, each a task of its
// own in its key's lane (see batchpart.go). A message that is no valid
// batch is dead-lettered whole; a job of it that breaks a rule is
// dead-lettered alone, the others run.
func (o *Owner) dispatchBatch(ln *lanes, msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	seq := meta.Sequence.Stream
	es, err := o.rules().ParseBatch(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		o.malformedBatch(msg, seq, err)
		return
	}
	b := &batchMsg{msg: msg, jobs: len(es), left: len(es)}
	if id := msg.Headers().Get(wire.HeaderJobID); wire.ValidateJobID(id) == nil {
		b.id = id
	}
	if !o.claimBatchID(msg, meta, es, b) {
		return // its ID's entry is another message's: refused whole
	}
	if c := b.claim; c != nil && hasMalformed(es) {
		// A batch with a malformed job (only a raw publisher sends one)
		// waits here for its claim: refused, it is dead-lettered whole,
		// never job by job first (job 0's dead-letter ID is the whole
		// batch's: the stream would drop the batch's as a duplicate).
		if !c.wait(o.ctx) {
			return // the tenure ended: unacked, for the next owner
		}
		if c.refused {
			if c.settle && o.l.Trusted() {
				if err := msg.Ack(); err != nil {
					o.stats.Unacked.Add(1)
					o.log.Warn("ack of a refused batch", "seq", seq, "err", err)
				}
			}
			return
		}
	}
	for i, e := range es {
		if e.Err == nil && o.keptInBatch(b, e.Job, i) {
			b.keep = o.keepBatch(b)
			o.open.add(b) // claimBatchID holds it open already, unless a copy is
			break
		}
	}
	// A copy the client published again (its first may have been lost,
	// and the caller may have called again by a job's ID meanwhile: the
	// server de-duplicates the batch's ID only) may have run before, as a
	// redelivery may: each job of it is looked up by ID before it runs
	// (process), and its outcome is kept where it would be.
	resent := msg.Headers()[wire.HeaderIdempotent] != nil
	maybeDup := meta.NumDelivered > 1 || seq <= o.prevDelivered || resent
	for i, e := range es {
		p := &batchPart{Msg: msg, b: b, subject: msg.Subject(), header: batchPartHeader(e), data: e.Payload}
		if e.Job.Key != "" {
			p.subject = partition.Subject(o.topo.Names.Namespace, o.p, e.Job.Key)
		}
		if e.Err != nil {
			o.malformedAt(p, seq, i, e.Job, e.Err)
			continue
		}
		t := &task{msg: p, batch: b, maybeDup: maybeDup, explicit: e.Job.Idempotent, keep: e.Job.KeepOutcome, keptInBatch: o.keptInBatch(b, e.Job, i)}
		if len(es) == 1 {
			t.redriveOf = msg.Headers().Get(wire.HeaderRedriveOf) // a redrive: checked against its ticket (checkRedrive)
		}
		t.stored = meta.Timestamp
		t.job = core.Job{
			ID: e.Job.ID, Key: e.Job.Key, Type: e.Job.Type, Payload: e.Payload, Partition: o.p,
			Seq: seq, Fence: o.l.Fence(), Headers: p.header,
		}
		core.SetIndex(&t.job, i)
		o.logReceived(t, meta.NumDelivered)
		// A job of a batch of several is never handed back: lanes.addTo
		// keeps it. A batch of one may be, whole, as a stalled key's job
		// that came alone. One addTo refuses is in flight here already (a
		// redelivery racing the original, whose ack covers it), or the
		// tenure is ending.
		if _, back, stalled := ln.addTo(t); back {
			o.handBack(t, stalled)
		}
	}
}

// hasMalformed reports whether a job of es breaks a rule.
func hasMalformed(es []wire.BatchEntry) bool {
	for _, e := range es {
		if e.Err != nil {
			return true
		}
	}
	return false
}

// rules are what this partition's jobs are checked against on receipt.
func (o *Owner) rules() wire.Rules {
	return wire.Rules{Namespace: o.topo.Names.Namespace, Partition: o.p, Partitions: o.topo.Partitions, ReplyPrefix: o.topo.Meta.ReplyPrefix,
		Delays: o.topo.Meta.Delays, DelaysStream: o.topo.Names.Delays(), MaxKeyBacklog: o.topo.Meta.MaxKeyBacklog}
}

// malformed dead-letters msg, which is no valid job (why), acks it, and
// tells a caller waiting on a valid reply subject (f.Reply).
func (o *Owner) malformed(msg jetstream.Msg, seq uint64, f wire.Job, why error) {
	o.malformedAt(msg, seq, 0, f, why)
}

// malformedAt is malformed for job index of a batch message (0: a
// one-job message).
func (o *Owner) malformedAt(msg jetstream.Msg, seq uint64, index int, f wire.Job, why error) {
	o.stats.Malformed.Add(1)
	// Logged once, by deadLetter ("job dead-lettered", err "malformed: …").
	o.refuseAt(msg, seq, index, f, fmt.Errorf("malformed: %w", why))
}

// malformedBatch dead-letters msg, a batch message refused whole (why),
// acks it, and tells its callers: every job its body still holds
// (wire.DecodeBatch) that names a reply subject under the reply prefix
// (wire.ValidateReply; never another subject, each told once) is
// answered with the refusal, as a one-job message's caller is. Its Calls
// would otherwise wait out their deadlines (a client routing with another
// partition count after a repartition: re-open it).
func (o *Owner) malformedBatch(msg jetstream.Msg, seq uint64, why error) {
	var tell []string
	if jobs, err := wire.DecodeBatch(msg.Data()); err == nil {
		seen := make(map[string]bool, len(jobs))
		for _, j := range jobs {
			if j.Reply != "" && !seen[j.Reply] && wire.ValidateReply(j.Reply, o.topo.Meta.ReplyPrefix) == nil {
				seen[j.Reply] = true
				tell = append(tell, j.Reply)
			}
		}
	}
	o.stats.Malformed.Add(1)
	o.refuseTelling(msg, seq, 0, wire.Job{}, fmt.Errorf("malformed: %w", why), tell)
}

// refuse dead-letters msg, which will never run (why), acks it, and tells
// a caller waiting on a valid reply subject (f.Reply).
func (o *Owner) refuse(msg jetstream.Msg, seq uint64, f wire.Job, why error) {
	o.refuseAt(msg, seq, 0, f, why)
}

// refuseAt is refuse for job index of a batch message (0: a one-job
// message), whose dead letter's ID names the index (wire.BatchDeadID).
func (o *Owner) refuseAt(msg jetstream.Msg, seq uint64, index int, f wire.Job, why error) {
	o.refuseTelling(msg, seq, index, f, why, nil)
}

// refuseTelling is refuseAt that also tells the callers waiting on tell,
// valid reply subjects, before the ack.
func (o *Owner) refuseTelling(msg jetstream.Msg, seq uint64, index int, f wire.Job, why error, tell []string) {
	err := core.Permanent(why)
	job := core.Job{ID: f.ID, Key: f.Key, Seq: seq, Partition: o.p, Fence: o.l.Fence()}
	core.SetIndex(&job, index)
	if !o.deadLetter(msg, job, err, 0) || !o.l.Trusted() {
		return
	}
	if bp, ok := msg.(*batchPart); ok && bp.b.keep != nil && o.keptInBatch(bp.b, f, index) {
		bp.b.record(index, f.ID, encodeResult(nil, err, true))
	}
	if f.Reply != "" {
		tell = append(tell, f.Reply)
	}
	for _, reply := range tell {
		if perr := o.nc.PublishMsg(replyMsg(reply, nil, err, true)); perr != nil {
			o.log.Warn("reply", "seq", seq, "err", perr)
		}
	}
	if err := msg.Ack(); err != nil {
		// Redelivered, it is dead-lettered again: say so.
		o.stats.Unacked.Add(1)
		o.log.Warn("ack of a dead-lettered malformed message", "seq", seq, "err", err)
	}
}
