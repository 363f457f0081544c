package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	jobbatcher "github.com/keylane/keylane/internal/batcher"
	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch messages on the client, the one wire path (see "Batches on the
// wire" in package jetstream's doc, and internal/tenure's batchpart.go for the worker).
//
// Submit and Call hand every job (a caller's ID or not; not a delayed job,
// a redrive, a job on a capped namespace or one larger than any batch of
// several: batchable) to the partition's batcher (internal/batcher): alone
// when nothing of its partition is in flight, as a batch of one; otherwise
// with the jobs that queued meanwhile, as one batch message. The others go
// alone, each a batch of one (Client.alone). No job goes in any other
// message. A batch whose publish fails in a way a
// reconnect or an election cures is published again whole, as it was:
// its batch ID (Nats-Msg-Id) makes the server drop a copy it has. A
// Call then waits for its reply (callBatched).

const (
	wireBatchMaxJobs = 256
	// wireBatchTimeout bounds one batch's publish and its retries.
	wireBatchTimeout = 30 * time.Second
)

// wireBatcher's outcome per job is its batch's publish error alone (a
// duplicate answer is an error or our own copy: sendWireBatch).
type wireBatcher = jobbatcher.Batcher[*nats.Msg, struct{}]

func newWireBatcher(c *Client, cork time.Duration) (*wireBatcher, error) {
	return jobbatcher.New(jobbatcher.Config[*nats.Msg, struct{}]{
		Send:     c.sendWireBatch,
		Size:     batchJobSize,
		MaxCount: wireBatchMaxJobs,
		MaxBytes: c.batchRoom(),
		Seal:     func(_ int, ms []*nats.Msg) { SealBatch(ms) },
		Cork:     cork,
	})
}

// batchRoom is the most bytes (by batchJobSize) the jobs of one batch
// message take: what both limits a batch meets leave, whichever is
// smaller. The server's max_payload less the dead
// letter's reserve, 1 KiB of headers and the body's head; and the wire's
// own limit on a body, wire.MaxBatchBytes less its head, which a server
// with a max_payload above 8 MiB makes the smaller (cut by max_payload
// only, the batch was refused whole by EncodeBatch, wire.ErrBatchTooLarge,
// and every job of it failed). A job larger than the room goes alone, as
// a batch of one, whose limit is max_payload's alone (the wire's 8 MiB is
// on a batch of several; Client.message refuses a job over max_payload up
// front, and Client.alone one whose batch of one would be,
// ErrPayloadTooLarge).
func (c *Client) batchRoom() int {
	room := min(int(c.nc.MaxPayload())-c.cfg.DeadLetterReserve-1024, wire.MaxBatchBytes) - wire.BatchHeaderSize
	return max(room, 1)
}

// HeaderSealedBatch names, on a job message the batcher cut into a batch,
// the batch's ID (SealBatch); it never travels (batchJobOf drops
// Keylane-* headers).
const HeaderSealedBatch = "Keylane-Sealed-Batch"

// SealBatch gives ms, a batch of two jobs or more as the batcher (or
// SubmitMany) cut it, its batch ID, and each job the ID that names its
// batch and index (wire.BatchedJobID): the worker refuses any other ID in
// a batch (wire.Rules.ParseBatch: the server de-duplicates no job of a
// batch, so an ID of the sender's choosing could claim another caller's
// job), and a batched Call's outcome is kept in its batch's entry
// (wire.BatchOutcomesKey), which its client, and a worker asked for the
// job by ID, find from the ID alone. Every job of a batch had a generated
// ID (a caller's never travels in one). It runs before any caller sees
// its job sent, so a job whose caller's context ends then is named by the
// ID it was sent with.
func SealBatch(ms []*nats.Msg) {
	batchID := NewID() // unguessable: see randid.go
	for i, m := range ms {
		m.Header[HeaderSealedBatch] = []string{batchID}
		if m.Header[wire.HeaderIdempotent] == nil {
			m.Header[wire.HeaderJobID] = []string{wire.BatchedJobID(batchID, i)}
		}
	}
}

// batchJobSize is the bytes m, a job message built by Client.message,
// takes in a batch body once sealed: wire.BatchJobSize of its batch form
// (batchJobOf), with what SealBatch may add to its ID (sealGrowth). The
// batcher, batchable and SubmitMany's batches measure a job by it.
func batchJobSize(m *nats.Msg) int {
	return wire.BatchJobSize(batchJobOf(m)) + sealGrowth(m)
}

// sealGrowth is how many bytes SealBatch may add to m's job ID.
func sealGrowth(m *nats.Msg) int {
	if m.Header[wire.HeaderIdempotent] != nil {
		return 0 // a caller's ID stays
	}
	return max(0, sealedIDLen-len(m.Header.Get(wire.HeaderJobID)))
}

var sealedIDLen = len(wire.BatchedJobID(NewID(), wireBatchMaxJobs-1))

// alone returns the message that carries m, a job that goes alone and
// at once, not through its partition's batcher, as a batch of one
// (batchMessage): a delayed job's submission (on its delay subject, its
// Keylane-Run-At on the batch), a redrive (its Keylane-Redrive-Of on the
// batch, which a worker takes only on a batch of one) and any job on a
// namespace with a key backlog cap (on its key's subject, where the
// server counts it against the cap), and a job larger than any batch of
// several (over wire.MaxBatchBytes, under a larger max_payload), whose
// batch of one may be as large as max_payload. m is sealed first
// (SealBatch: a generated ID becomes its batch's and index's), so read
// m's ID after it. A batch of one over max_payload less the dead letter's
// reserve (which Client.message's estimate of m may not have seen: the
// batch's own headers) is refused, ErrPayloadTooLarge, before anything is
// sent.
func (c *Client) alone(m *nats.Msg) (*nats.Msg, error) {
	bm, err := c.batchMessage(partition.Of(m.Header.Get(wire.HeaderKey), c.n), []*nats.Msg{m})
	if err != nil {
		return nil, err
	}
	if max, size := c.nc.MaxPayload()-int64(c.cfg.DeadLetterReserve), core.MessageSize(bm); size > max {
		return nil, fmt.Errorf("%w: %d bytes as a batch of one, limit %d (max_payload less %d for a dead letter's headers)", core.ErrPayloadTooLarge, size, max, c.cfg.DeadLetterReserve)
	}
	if c.beforeAlone != nil {
		c.beforeAlone(bm)
	}
	return bm, nil
}

// batchable reports whether m, built by message, travels through its
// partition's batcher: not a delayed job, not a redrive, not on a
// namespace with a key backlog cap (the server counts messages per key
// subject, and a batch's is no key's: there a job goes alone), not
// a job larger than any batch.
func (c *Client) batchable(m *nats.Msg) bool {
	if c.maxKeyBacklog != 0 || m.Header[wire.HeaderRunAt] != nil || m.Header[wire.HeaderRedriveOf] != nil {
		return false
	}
	// A job no batch of several can carry (over wire.MaxBatchBytes, under
	// a larger max_payload) goes alone, as a batch of one.
	if room := c.batchRoom(); len(m.Data) > room/2 && batchJobSize(m) > room {
		return false
	}
	return true
}

// sendWireBatch publishes ms, jobs of partition p, as one batch message
// (a lone job as a batch of one). Every job's outcome is the publish's
// error.
func (c *Client) sendWireBatch(ctx context.Context, p int, ms []*nats.Msg) []jobbatcher.Outcome[struct{}] {
	ctx, cancel := context.WithTimeout(ctx, wireBatchTimeout)
	defer cancel()
	out := make([]jobbatcher.Outcome[struct{}], len(ms))
	m, err := c.batchMessage(p, ms)
	if err == nil && len(ms) > 1 && c.beforeBatch != nil {
		c.beforeBatch(m)
	}
	if err == nil {
		var dup bool
		dup, err = c.publishWatched(ctx, m) // a refused publish (permissions) ends it at once
		// A duplicate answer to a batch's first copy (publish reports no
		// other) is another message under its ID: the batch was not
		// stored. To a later copy it is our earlier one (a batch ID is
		// unguessable: randid.go), stored. A job with a caller's ID that
		// the stream held before is the worker's to de-duplicate.
		if dup && err == nil {
			err = errBatchIDUsed
		}
	}
	for i := range out {
		out[i] = jobbatcher.Outcome[struct{}]{Err: err}
	}
	return out
}

// errBatchIDUsed: the stream held a message under a batch's ID before
// its first copy was sent, so the batch was dropped as a duplicate.
var errBatchIDUsed = errors.New("keylane: batch ID already used: not stored")

// batchMessage returns the batch message carrying ms, jobs of partition p
// built by Client.message (a lone job as a batch of one), with an ID of
// its own. It travels on p's batch subject; on a namespace with a key
// backlog cap, where ms is one job (alone), on that job's key's subject,
// where the server counts it against the cap (wire.Rules.ParseBatch). A
// redrive, alone too, carries its Keylane-Redrive-Of on the batch.
func (c *Client) batchMessage(p int, ms []*nats.Msg) (*nats.Msg, error) {
	if ms[0].Header.Get(HeaderSealedBatch) == "" {
		SealBatch(ms) // SubmitMany's and alone's (the batcher's are sealed when cut)
	}
	subject := wire.BatchSubject(c.cfg.Namespace, p)
	runAt := ms[0].Header[wire.HeaderRunAt]
	switch {
	case runAt != nil:
		// A delayed job's submission: alone, on its (sealed) ID's delay
		// subject, its run-at on the batch.
		if len(ms) != 1 {
			return nil, fmt.Errorf("keylane: a delayed job in a batch of %d jobs (a delayed job goes alone)", len(ms))
		}
		subject = partition.DelaySubject(c.cfg.Namespace, p, ms[0].Header.Get(wire.HeaderJobID))
	case c.maxKeyBacklog != 0:
		if len(ms) != 1 {
			return nil, fmt.Errorf("keylane: %d jobs in one batch on a namespace with a key backlog cap (a batch there carries one job)", len(ms))
		}
		subject = ms[0].Subject
	}
	id := ms[0].Header.Get(HeaderSealedBatch)
	jobs := make([]wire.BatchJob, len(ms))
	for i, m := range ms {
		jobs[i] = batchJobOf(m)
	}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		return nil, err
	}
	bm := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{
		wire.HeaderJobID:               {id},
		jetstream.ExpectedStreamHeader: c.expect[c.cfg.Shard(p)],
		wire.HeaderBatch:               {"1"},
		wire.HeaderBatchJobs:           {strconv.Itoa(len(ms))},
		wire.HeaderPartitions:          c.nHeader,
	}}
	if runAt != nil {
		bm.Header[wire.HeaderRunAt] = runAt
	}
	if of := ms[0].Header[wire.HeaderRedriveOf]; of != nil {
		if len(ms) != 1 {
			return nil, fmt.Errorf("keylane: a redrive in a batch of %d jobs (a redrive goes alone)", len(ms))
		}
		bm.Header[wire.HeaderRedriveOf] = of
	}
	return bm, nil
}

// manyBatches is SubmitMany's batching (ClientConfig.Batches): per
// partition, the batchable jobs given in a row are cut into batch
// messages of at most wireBatchMaxJobs and the batcher's byte limit, each
// published as soon as it is full or a job of its partition that goes
// alone comes next (so a key's jobs are stored in the order given).
type manyBatches struct {
	c      *Client
	room   int
	open   map[int]*manyBatch
	sent   []*manyBatch
	failed []*manyBatch // not published: their jobs' Err is set by wait
}

type manyBatch struct {
	p     int
	idx   []int // the jobs' indexes in SubmitMany's slice
	ms    []*nats.Msg
	bytes int
	m     *nats.Msg
	f     jetstream.PubAckFuture
	err   error
}

func (c *Client) newManyBatches() *manyBatches {
	return &manyBatches{c: c, room: c.batchRoom(), open: map[int]*manyBatch{}}
}

// add queues job i (m) of partition p, publishing its partition's batch
// first if m would not fit in it.
func (mb *manyBatches) add(p, i int, m *nats.Msg) {
	size := batchJobSize(m)
	if b := mb.open[p]; b != nil && (len(b.ms) >= wireBatchMaxJobs || b.bytes+size > mb.room) {
		mb.flush(p)
	}
	b := mb.open[p]
	if b == nil {
		b = &manyBatch{p: p}
		mb.open[p] = b
	}
	b.idx, b.ms, b.bytes = append(b.idx, i), append(b.ms, m), b.bytes+size
}

// flush publishes partition p's open batch, if any.
func (mb *manyBatches) flush(p int) {
	b := mb.open[p]
	if b == nil {
		return
	}
	delete(mb.open, p)
	if b.m, b.err = mb.c.batchMessage(p, b.ms); b.err == nil {
		if len(b.ms) > 1 && mb.c.beforeBatch != nil {
			mb.c.beforeBatch(b.m)
		}
		b.f, b.err = mb.c.async.PublishMsgAsync(b.m, jetstream.WithStallWait(30*time.Second))
	}
	if b.err != nil {
		mb.failed = append(mb.failed, b)
		return
	}
	mb.sent = append(mb.sent, b)
}

// drop fails the jobs of every batch not published yet (ctx ended): none
// may look stored.
func (mb *manyBatches) drop(out []Submitted, why error) {
	for p, b := range mb.open {
		for _, i := range b.idx {
			out[i].Err = fmt.Errorf("keylane: not submitted: %w", why)
		}
		delete(mb.open, p)
	}
}

// sealedIDs gives each job of a batch built (SealBatch) the ID it
// was sent with.
func (mb *manyBatches) sealedIDs(out []Submitted) {
	for _, list := range [][]*manyBatch{mb.sent, mb.failed} {
		for _, b := range list {
			for k, i := range b.idx {
				out[i].ID = b.ms[k].Header.Get(wire.HeaderJobID)
			}
		}
	}
}

// abandon is drop, and for every published batch "stored or not".
func (mb *manyBatches) abandon(out []Submitted, done error) {
	mb.drop(out, done)
	mb.sealedIDs(out)
	for _, b := range mb.sent {
		for _, i := range b.idx {
			out[i].Err = fmt.Errorf("keylane: submit %s: no stream ack, stored or not: %w", out[i].ID, done)
		}
	}
}

// wait flushes every open batch and sets each batched job's outcome in
// out: its batch's ack, publishing a batch again whole (its ID) while
// the failure is one a reconnect or an election cures. It returns ctx's
// error (or core.ErrClosed) when it ended before every ack was seen.
func (mb *manyBatches) wait(ctx context.Context, out []Submitted, rs *refusals) error {
	for p := range mb.open {
		mb.flush(p)
	}
	mb.sealedIDs(out)
	for _, b := range mb.failed {
		for _, i := range b.idx {
			out[i].Err = fmt.Errorf("keylane: submit %s: %w", out[i].ID, b.err)
		}
	}
	for n, b := range mb.sent {
		ack, err, done := mb.c.awaitPubAck(ctx, b.f, rs)
		switch {
		case done == nil && err == nil && ack.Duplicate:
			// The first copy's answer: another message has its ID
			// (sendWireBatch).
			err = errBatchIDUsed
		case done != nil:
			for _, b := range mb.sent[n:] {
				for _, i := range b.idx {
					out[i].Err = fmt.Errorf("keylane: submit %s: no stream ack, stored or not: %w", out[i].ID, done)
				}
			}
			return done
		case err != nil && retryablePublish(err):
			// A later copy: a duplicate answer is the first one's, and
			// the worker looks its jobs up by ID (the first may have been
			// lost and a job retried by its ID meanwhile).
			b.m.Header[wire.HeaderIdempotent] = oneHeader
			_, err = mb.c.publishWatched(ctx, b.m)
		}
		if err != nil {
			for _, i := range b.idx {
				out[i].Err = fmt.Errorf("keylane: submit %s: %w", out[i].ID, natserr.Once(err))
			}
		}
	}
	return nil
}

// batchJobOf reads a job message built by Client.message back into its
// batch form: keylane's headers become fields, the submitter's own stay
// headers, the server's (Nats-Expected-Stream) go.
func batchJobOf(m *nats.Msg) wire.BatchJob {
	get := func(name string) string {
		if vs := m.Header[name]; len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
	j := wire.BatchJob{Key: get(wire.HeaderKey), ID: get(wire.HeaderJobID), Type: get(wire.HeaderType), Reply: get(wire.HeaderReply),
		KeepOutcome: get(wire.HeaderKeepOutcome) != "", Idempotent: get(wire.HeaderIdempotent) != "", Payload: m.Data}
	for k, vs := range m.Header {
		if hasPrefixFold(k, "Nats-") || hasPrefixFold(k, "Keylane-") {
			continue
		}
		if j.Header == nil {
			j.Header = make(map[string][]string, len(m.Header))
		}
		j.Header[k] = vs
	}
	return j
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// submitBatched is Submit's path for a batchable job m of ID id.
func (c *Client) submitBatched(ctx context.Context, m *nats.Msg, id string, p int) (string, error) {
	_, err := c.wire.Do(ctx, p, m)
	id = m.Header.Get(wire.HeaderJobID) // (read after Do: cut into a batch, it was sealed)
	switch {
	case errors.Is(err, jobbatcher.ErrClosed):
		return "", fmt.Errorf("keylane: submit %s: %w", id, core.ErrClosed)
	case err != nil:
		return "", fmt.Errorf("keylane: submit %s: %w", id, natserr.Once(err))
	}
	return id, nil
}

// callBatched is Call's path for a batchable job m of ID id (generated,
// never the caller's), bound for partition p, whose reply comes to w. The
// job goes through the partition's batcher like a batched Submit: its
// reply subject and keep-outcome flag travel in the batch body, and its
// stream ack is its batch's, resent whole under the batch's own ID while
// the failure is one a reconnect or an election cures (publish's bounded
// retries), so the server drops a copy it has. The job is never published
// again alone: a copy under its own ID would not be de-duplicated against
// the batch, and the stream would hold it twice. Cut into a batch, the
// job's ID names the batch and its index (SealBatch). Once stored, the
// reply is awaited as Call does, and a reply lost on the worker's side is
// recovered from the outcome the worker keeps: in its batch's entry, or
// by its ID where the worker keeps it so (a lone job; a namespace without
// held outcomes; StoreResults).
func (c *Client) callBatched(ctx context.Context, m *nats.Msg, id string, p int, w *waiter) ([]byte, error) {
	_, err := c.wire.Do(ctx, p, m)
	// (Read after Do: the batcher's seal happened before it returned.)
	id = m.Header.Get(wire.HeaderJobID)
	switch {
	case errors.Is(err, jobbatcher.ErrClosed):
		return nil, fmt.Errorf("keylane: call %s: %w", id, core.ErrClosed)
	case errors.Is(err, jobbatcher.ErrUnknown), errors.Is(err, jobbatcher.ErrNotSent):
		// ctx ended, the job sent (stored or not) or not: no reply, as
		// Call promises (err says which, and is ctx's error too).
		return nil, &core.NoReplyError{JobID: id, Err: err}
	case err != nil:
		return nil, fmt.Errorf("keylane: submit %s: %w", id, natserr.Once(err))
	}
	status := *c.reconnected.Load()
	rec := c.newRecovery(ctx, id)
	defer rec.stop() // no watcher outlives Call
	replyTimer := time.NewTimer(replyWait)
	defer replyTimer.Stop()
	for {
		select {
		case <-replyTimer.C:
			rec.start()
		case <-status:
			status = *c.reconnected.Load()
			rec.start() // the reply may have been lost while we were away
		case o := <-rec.ch:
			return o.res, o.err
		case reply := <-w.result:
			return c.replied(ctx, m, reply)
		case notice := <-w.held:
			return nil, heldError(id, notice)
		case <-ctx.Done():
			return nil, &core.NoReplyError{JobID: id, Err: ctx.Err()}
		case <-c.done:
			return nil, fmt.Errorf("keylane: call %s: %w", id, core.ErrClosed)
		}
	}
}
