package keylane

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
		// Hold at most MaxInFlight jobs in memory (the lanes' window); the
		// server's window (MaxPending) is larger, so jobs a stalled key
		// hands back do not stop the others.
		for _, t := range ln.waitRoom() {
			o.handBack(t, false)
		}
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
			o.backlog.Store(meta.NumPending)
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
	if !strings.HasSuffix(msg.Subject(), "."+partition.KeyToken(key)) {
		// Not the key's own subject: it would bypass the key's backlog cap.
		o.malformed(msg, meta.Sequence.Stream, fmt.Errorf("subject %q is not key %q's (token %s)", msg.Subject(), key, partition.KeyToken(key)))
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
		id = h.Get(HeaderDelayedID) // a delayed job, stored when due
	}
	if id == "" {
		id = syntheticIDPrefix + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	t := &task{msg: msg, maybeDup: meta.NumDelivered > 1 || meta.Sequence.Stream <= o.prevDelivered, explicit: h.Get(HeaderIdempotent) != "", keep: h.Get(HeaderKeepOutcome) != ""}
	if of := h.Get(HeaderRedriveOf); of != "" && ValidateJobID(of) == nil {
		t.redriveOf = of
	}
	t.stored = meta.Timestamp
	t.job = Job{
		ID: id, Key: key, Type: h.Get(HeaderType), Payload: msg.Data(), Partition: o.p,
		Seq: meta.Sequence.Stream, Fence: o.l.Fence(), Headers: h,
	}
	o.logReceived(t, meta.NumDelivered)
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
	if err := msg.Ack(); err != nil {
		// Redelivered, it is dead-lettered again: say so.
		o.w.stats.unacked.Add(1)
		o.log.Warn("ack of a dead-lettered malformed message", "seq", seq, "err", err)
	}
}
