package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Call stores a job and waits for its handler's result. A handler error
// comes back as a *core.RemoteError. If ctx ends first, Call returns a
// *core.NoReplyError (errors.Is core.ErrNoReply and ctx.Err()). A job the worker
// holds until an operator acts (a re-created jobs stream, core.ErrEpoch) ends
// it with a *HeldError at once: stored, not failed. A publish the server
// refuses (a permissions violation for the job's subject) ends it within
// its first ack wait, errors.Is nats.ErrPermissionViolation.
//
// Retries: a Call with the same WithID as an earlier one returns that
// job's outcome, at once if it finished, when it finishes if it still runs,
// and never runs it twice: the worker looks a job with a caller's ID up in
// the outcomes it keeps by ID (for ResultsTTL) before running it, and
// answers a copy from the first's outcome.
//
// A Call travels in its partition's batch message (see callBatched), with
// or without WithID; on a namespace with a key backlog cap it goes alone,
// as a batch of one on its key's subject (alone), published again under
// its batch's ID until stored (the server drops a copy it has), each later
// copy marked for the worker to look the job's ID up before running it.
func (c *Client) Call(ctx context.Context, r *Request) (_ []byte, err error) {
	if r.optErr != nil && !errors.Is(r.optErr, core.ErrBadDelay) {
		return nil, r.optErr // a refused header
	}
	if r.optErr != nil || !r.RunAt.IsZero() {
		return nil, errors.Join(core.ErrDelayedCall, r.optErr)
	}
	token, w, err := c.wait()
	if err != nil {
		return nil, err
	}
	defer c.unwait(token)
	m, err := c.message(r, c.inbox+token)
	if err != nil {
		return nil, err
	}
	span := c.tracing.Send(ctx, "call", m) // starts the span now
	defer span.End(&err)
	// The worker keeps a Call's outcome by ID, so a reply lost with a
	// connection is recovered from it.
	m.Header[wire.HeaderKeepOutcome] = oneHeader
	if c.batchable(m) {
		defer span.MessageID(m) // sealed into a batch, it went under another ID
		return c.callBatched(ctx, m, r.ID, partition.Of(r.Key, c.n), w)
	}
	// Publish without waiting for the stream's ack: it comes to our inbox
	// like the result does, and only an error in it matters. The result
	// itself proves the job was stored. This saves a blocking round trip
	// per call and the request machinery of a synchronous publish.
	wm, err := c.alone(m) // a redrive, on a capped namespace, or larger than any batch of several: a batch of one
	if err != nil {
		return nil, err
	}
	r.ID = m.Header.Get(wire.HeaderJobID) // (sealed when alone)
	span.MessageID(m)
	before := c.nc.LastError() // a refusal after it is this publish's
	status := *c.reconnected.Load()
	publish := func(m *nats.Msg) {
		m.Reply = c.inbox + ackPrefix + token
		// A failed publish (disconnected, buffer full) is like a lost one:
		// the ack timer publishes again.
		_ = c.nc.PublishMsg(m)
	}
	publish(wm)
	// No stream ack within ackWait: the publish, or its ack, was lost (a
	// reconnect, a stream leader change). Publish again with the same job
	// ID; the stream drops it if it has the job, and the copy asks the
	// worker to look the ID up before running it.
	ackWait := callAckWait
	ackTimer := time.NewTimer(ackWait)
	defer ackTimer.Stop()
	acked := false
	republish := func() {
		again := &nats.Msg{Subject: wm.Subject, Data: wm.Data, Header: maps.Clone(wm.Header)}
		again.Header[wire.HeaderIdempotent] = oneHeader
		publish(again)
		ackWait = min(2*ackWait, maxCallAckWait)
		ackTimer.Reset(ackWait)
	}
	rec := c.newRecovery(ctx, r.ID)
	defer rec.stop() // no watcher outlives Call
	// A stored job whose reply has not come within replyWait may have lost
	// it on the worker's side (a reply sent while its connection or lease
	// was failing): look for the kept outcome as well.
	replyTimer := time.NewTimer(time.Hour)
	replyTimer.Stop()
	defer replyTimer.Stop()
	for {
		select {
		case ack := <-w.ack:
			dup, err := natserr.AckError(ack)
			if errors.Is(err, jetstream.ErrNoStreamResponse) {
				// No stream leader right now (an election: the timer
				// publishes again), or no stream at all (say so at once).
				if gone := c.noStream(ctx, m); gone != nil {
					return nil, fmt.Errorf("keylane: submit %s: %w: %w", r.ID, err, gone)
				}
				if !acked {
					ackTimer.Reset(noLeaderPause)
				}
				continue
			}
			if natserr.IsTransient(err) {
				// The stream could not store it right now (503, cluster
				// unavailable): publish again, as after an election.
				if !acked {
					ackTimer.Reset(noLeaderPause)
				}
				continue
			}
			if err != nil {
				res, applied, err := c.refused(ctx, m, err)
				if applied {
					return res, err // an earlier call with this ID was applied
				}
				var queued *queuedError
				if errors.As(err, &queued) {
					// Stored by an earlier call with this ID, still queued:
					// its outcome is kept by ID when it runs.
					return c.awaitOutcome(ctx, r.ID)
				}
				return nil, fmt.Errorf("keylane: submit %s: %w", r.ID, err)
			}
			if dup && !acked {
				// Stored before, by an earlier call with this ID (or our own
				// earlier copy): its outcome is kept by ID.
				return c.awaitOutcome(ctx, r.ID)
			}
			if !acked {
				replyTimer.Reset(replyWait)
			}
			acked = true
			ackTimer.Stop()
		case <-replyTimer.C:
			rec.start()
		case <-ackTimer.C:
			if !acked {
				if refused := natserr.Refusal(c.nc, before, m.Subject); refused != nil {
					return nil, fmt.Errorf("keylane: submit %s: %w", r.ID, refused)
				}
				republish()
			}
		case <-status:
			status = *c.reconnected.Load()
			// The reply may have been lost while we were away: look for
			// the kept outcome too, and publish again if unacked.
			if !acked {
				republish()
			}
			rec.start()
		case o := <-rec.ch:
			return o.res, o.err
		case reply := <-w.result:
			return c.replied(ctx, m, reply)
		case notice := <-w.held:
			return nil, heldError(r.ID, notice)
		case <-ctx.Done():
			return nil, &core.NoReplyError{JobID: r.ID, Err: ctx.Err()}
		case <-c.done:
			return nil, fmt.Errorf("keylane: call %s: %w", r.ID, core.ErrClosed)
		}
	}
}

// noStream says why a publish to m's jobs stream found no responder when
// the cause lasts: the stream is gone (core.ErrNoTopology), or it routes with
// another partition count than c (core.ErrPartitionMismatch: the namespace was
// repartitioned since c was opened, and m's partition subject may exist no
// more). nil: a stream without a leader for a moment, or frozen by a
// repartition that is draining it: publishing again may succeed.
func (c *Client) noStream(ctx context.Context, m *nats.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	s, err := c.js.Stream(ctx, m.Header.Get(jetstream.ExpectedStreamHeader))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return core.ErrNoTopology
	case err != nil:
		return nil
	}
	if err := c.cfg.CheckStream(s.CachedInfo().Config); err != nil {
		return fmt.Errorf("%w (the namespace was repartitioned since this client was opened: open it again)", err)
	}
	return nil
}

// replied reads the reply to the Call of m. A refusal of it as malformed
// (dead-lettered, "malformed: …") while m's jobs stream routes with
// another partition count than c is core.ErrPartitionMismatch as well, with
// the worker's reason: c was opened before a repartition, and every Call
// of it is refused so until it is opened again (the worker refuses a
// stale batch whole, a stale job alone). Asked of the server only on such
// a refusal.
func (c *Client) replied(ctx context.Context, m *nats.Msg, o outcome) ([]byte, error) {
	res, err := o.res, o.err
	var re *core.RemoteError
	if errors.As(err, &re) && re.DeadLettered && strings.HasPrefix(re.Message, "malformed: ") {
		if serr := c.noStream(ctx, m); errors.Is(serr, core.ErrPartitionMismatch) {
			return nil, fmt.Errorf("%w: %w", serr, err)
		}
	}
	return res, err
}

// recovery reads a Call's outcome from what the worker keeps
// (awaitOutcome) when its reply may have been lost: started at most once,
// on the Call's first doubt, and stopped with the Call, so no watcher
// outlives it. ch is nil, and blocks a select, until start.
type recovery struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	id     string
	wg     sync.WaitGroup
	ch     chan outcome
}

func (c *Client) newRecovery(ctx context.Context, id string) *recovery {
	rctx, cancel := context.WithCancel(ctx)
	return &recovery{c: c, ctx: rctx, cancel: cancel, id: id}
}

// start begins watching for the kept outcome, once.
func (r *recovery) start() {
	if r.ch != nil {
		return
	}
	r.ch = make(chan outcome, 1)
	r.wg.Go(func() {
		res, err := r.c.awaitOutcome(r.ctx, r.id)
		r.ch <- outcome{res, err}
	})
}

// stop ends the watch and waits for it.
func (r *recovery) stop() {
	r.cancel()
	r.wg.Wait()
}

// outcome is a job's result or error.
type outcome struct {
	res []byte
	err error
}

// How long Call waits for the stream's ack before it publishes the job
// again, doubling up to the maximum.
const (
	callAckWait    = time.Second
	maxCallAckWait = 2 * time.Second
	// replyWait is how long Call waits for the reply of a stored job
	// before it also watches the results bucket for the kept outcome.
	replyWait = 5 * time.Second
	// noLeaderPause is how soon Call publishes again after the stream
	// answered that it has no leader (an election: seconds on a cluster).
	noLeaderPause = 250 * time.Millisecond
)

// awaitOutcome waits for the outcome the worker keeps under a job ID in
// the results bucket: at once if the job finished, when it finishes if it
// still runs. It reads the key with bounded requests every outcomePoll and,
// beside that, watches it. The watch is set up on its own goroutine: its
// consumer-create request is bounded only by ctx, so one lost in a leader
// election, or refused to a client that may read the bucket but not
// consume it (docs/security/accounts.conf), must not hold up the reads
// until the caller's deadline.
//
// A job ID that names a batch and an index (wire.BatchedJobID: a batched
// Call's) is looked for in that batch's entry too.
func (c *Client) awaitOutcome(ctx context.Context, id string) ([]byte, error) {
	batchID, index, ok := wire.ParseBatchedJobID(id)
	if !ok {
		batchID = ""
	}
	return c.awaitKept(ctx, id, batchID, index)
}

// awaitKept is awaitOutcome for job id, which is also, when batchID is
// not "", job index of batch batchID: its outcome is then looked for in
// the batch's entry (wire.BatchOutcomesKey) as well as under its ID (a
// worker keeps a batched Call's outcome by ID where nothing cheaper keeps
// its promises: "Batches on the wire" in package jetstream's doc). A
// batch entry that is not this batch's, or holds another job at the
// index, or does not decode, is an error, never another job's outcome;
// one without an outcome at the index keeps none for this job (it may be
// kept by ID, or a reply may come): awaitKept waits on.
func (c *Client) awaitKept(ctx context.Context, id, batchID string, index int) ([]byte, error) {
	keys := []string{id}
	if batchID != "" {
		keys = append(keys, wire.BatchOutcomesKey(batchID))
	}
	wctx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer watching.Wait()
	defer stopWatch()
	watched := make(chan jetstream.KeyValueEntry, 1)
	var kv jetstream.KeyValue
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		var found []jetstream.KeyValueEntry
		select {
		case e := <-watched:
			found = append(found, e)
		case <-poll.C:
			poll.Reset(outcomePoll)
			if kv == nil {
				// The bucket may be electing a leader: try again next time.
				var err error
				if kv, err = c.resultsBucket(ctx); err != nil {
					continue
				}
				watching.Go(func() { watchOutcome(wctx, kv, keys, watched) })
			}
			for _, k := range keys {
				gctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
				got, err := kv.Get(gctx, k)
				cancel()
				if err == nil {
					found = append(found, got)
				}
			}
		case <-ctx.Done():
			return nil, &core.NoReplyError{JobID: id, Err: ctx.Err()}
		case <-c.done:
			return nil, fmt.Errorf("keylane: outcome of %s: %w", id, core.ErrClosed)
		}
		for _, e := range found {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			v := e.Value()
			if e.Key() != id {
				var err error
				v, err = wire.FindBatchOutcome(v, batchID, index, id)
				switch {
				case errors.Is(err, wire.ErrNoBatchOutcome):
					continue
				case err != nil:
					return nil, fmt.Errorf("keylane: stored outcome of %s in its batch's entry: %w", id, err)
				}
			}
			res, rerr, ok := core.DecodeOutcome(v)
			if !ok {
				return nil, fmt.Errorf("keylane: malformed stored result for %s", id)
			}
			return res, rerr
		}
	}
}

// watchOutcome sends the first value put under one of keys to out, until
// ctx ends. A watch that cannot be set up (refused, or no leader) leaves
// the polling to awaitKept.
func watchOutcome(ctx context.Context, kv jetstream.KeyValue, keys []string, out chan<- jetstream.KeyValueEntry) {
	w, err := kv.WatchFiltered(ctx, slices.Clone(keys)) // it rewrites the slice
	if err != nil {
		return
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				select {
				case out <- e:
				default:
				}
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// outcomePoll is how often awaitOutcome reads the results bucket besides
// watching it.
const outcomePoll = time.Second

// resultsBucket opens the results bucket once.
func (c *Client) resultsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	kv := c.results
	c.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	rctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	kv, err := c.js.KeyValue(rctx, c.cfg.ResultsBucket)
	if err != nil {
		return nil, fmt.Errorf("results bucket: %w", err)
	}
	c.mu.Lock()
	c.results = kv
	c.mu.Unlock()
	return kv, nil
}

// waiter receives one job's stream acks and its result, on separate
// channels: re-publishes bring extra acks, which must never crowd out the
// result.
type waiter struct {
	ack chan *nats.Msg
	// result is the job's outcome, decoded once from whichever reply
	// brought it (a single reply, or its entry of a grouped one).
	result chan outcome
	held   chan *nats.Msg // a held notice (held.go)
}

func (c *Client) wait() (string, *waiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, core.ErrClosed
	}
	if c.sub == nil {
		c.inbox = c.replyPrefix + nuid.Next() + "."
		sub, err := c.nc.Subscribe(c.inbox+"*", c.deliver)
		if err != nil {
			return "", nil, err
		}
		_ = sub.SetPendingLimits(-1, -1)
		c.sub = sub
	}
	// wire.GroupedMark tells workers this client takes grouped replies.
	token := wire.GroupedMark + strconv.FormatUint(c.token.Add(1), 36)
	w := &waiter{ack: make(chan *nats.Msg, 1), result: make(chan outcome, 1), held: make(chan *nats.Msg, 1)}
	c.waiters[token] = w
	return token, w, nil
}

func (c *Client) unwait(token string) {
	c.mu.Lock()
	delete(c.waiters, token)
	c.mu.Unlock()
}

func (c *Client) deliver(m *nats.Msg) {
	token := m.Subject[len(c.inbox):]
	if token == wire.GroupedMark {
		c.deliverGrouped(m)
		return
	}
	if rest, ok := strings.CutPrefix(token, core.HeldMark); ok {
		c.deliverHeld(rest, m)
		return
	}
	if rest, ok := strings.CutPrefix(token, ackPrefix); ok {
		if w := c.waiter(rest); w != nil {
			select {
			case w.ack <- m:
			default: // an extra ack (a re-publish): the first one won
			}
		}
		return
	}
	res, err := DecodeReply(m)
	c.deliverOutcome(token, outcome{res, err})
}

// waiter returns token's waiter, nil when none waits.
func (c *Client) waiter(token string) *waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiters[token]
}

// deliverOutcome hands a decoded outcome to token's waiter. Extra ones (a
// redelivered job's second reply) are dropped: the first one won.
func (c *Client) deliverOutcome(token string, o outcome) {
	w := c.waiter(token)
	if w == nil {
		return
	}
	select {
	case w.result <- o:
	default:
	}
}
