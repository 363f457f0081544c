package tenure

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch messages on the worker (every worker reads them; see "Batches on
// the wire" in package jetstream's doc). Each job of a batch runs as a task of
// its own whose msg is a batchPart: the job's own subject, headers and
// payload, as a one-job message of it would carry them, so finish, the
// dead letters, the replies and the traces read it as they read a job.
// Its Ack settles the job; the batch message itself is acked once every
// job of it is settled. A job of a batch of several is never handed back
// (NAKed): the lanes keep it (internal/lanes); a batch of one is handed
// back whole (owner.handBack).

// errBatchPartNak is what a NAK of one job of a batch returns: the
// message carries the other jobs too.
var errBatchPartNak = errors.New("a job of a batch message cannot be handed back alone")

// batchMsg is one received batch message and how many of its jobs are
// not settled yet.
type batchMsg struct {
	msg jetstream.Msg
	mu  sync.Mutex
	// jobs is how many jobs it carries (valid or not).
	jobs int
	// left is how many jobs of it are not settled; the message is acked
	// when it reaches 0.
	left int
	// touched is when InProgress was last sent for it: the lanes touch
	// each job, one is enough per period.
	touched time.Time

	// id is the batch's ID (its Nats-Msg-Id), "" when it is no valid job
	// ID. outs are the outcomes of its jobs kept per batch (under mu), and
	// keep writes them before the message is acked (batchoutcomes.go);
	// nil when none of its jobs is.
	id   string
	outs []wire.BatchOutcome
	keep func() error

	// origin names this message (its stream, the stream's epoch and its
	// sequence: batchOrigin) on a worker that keeps outcomes per batch;
	// its ID's entry is bound to it (kept.HeaderBatchOrigin). entryRev is the
	// entry's revision as read on receipt (0: none): the entry is written
	// only over that (batchoutcomes.go, claimBatchID).
	origin   string
	entryRev uint64
	// claim is the read of its ID's entry on receipt (claimBatchID), nil
	// when none was needed; none of its jobs runs before it ended.
	claim *batchClaim

	// entry is the batch's entry as the results stream's leader held it,
	// read once for the jobs of a redelivered batch looked up by ID
	// (batchoutcomes.go, batchEntry); entryMu is held across that read.
	entryMu sync.Mutex
	entry   *batchEntryRead
}

// batchPart is one job of a batch message.
type batchPart struct {
	jetstream.Msg // the batch message: Metadata, Reply
	b             *batchMsg
	subject       string
	header        nats.Header
	data          []byte
	settled       bool // under b.mu
}

func (p *batchPart) Subject() string      { return p.subject }
func (p *batchPart) Headers() nats.Header { return p.header }
func (p *batchPart) Data() []byte         { return p.data }

// Ack settles the job; the last job settled acks the batch message, and
// its error is the ack's. A job settled twice counts once.
func (p *batchPart) Ack() error {
	p.b.mu.Lock()
	if p.settled {
		p.b.mu.Unlock()
		return nil
	}
	p.settled = true
	p.b.left--
	last := p.b.left == 0
	p.b.mu.Unlock()
	if !last {
		return nil
	}
	if p.b.keep != nil {
		if err := p.b.keep(); err != nil {
			return err
		}
	}
	return p.b.msg.Ack()
}

// DoubleAck is Ack; the batch message's own ack is a plain one.
func (p *batchPart) DoubleAck(context.Context) error { return p.Ack() }

func (p *batchPart) Nak() error                       { return errBatchPartNak }
func (p *batchPart) NakWithDelay(time.Duration) error { return errBatchPartNak }
func (p *batchPart) Term() error                      { return errBatchPartNak }
func (p *batchPart) TermWithReason(string) error      { return errBatchPartNak }

// InProgress keeps the batch message from being redelivered, once per
// half second however many of its jobs ask.
func (p *batchPart) InProgress() error {
	p.b.mu.Lock()
	now := time.Now()
	if now.Sub(p.b.touched) < 500*time.Millisecond {
		p.b.mu.Unlock()
		return nil
	}
	p.b.touched = now
	p.b.mu.Unlock()
	return p.b.msg.InProgress()
}

// batchPartHeader is the header a one-job message of e would carry: the
// job ID, key, type, reply and flags in keylane's headers, and the
// submitter's own.
func batchPartHeader(e wire.BatchEntry) nats.Header {
	h := make(nats.Header, 6+len(e.Header))
	for k, vs := range e.Header {
		h[k] = vs
	}
	if e.Job.ID != "" {
		h[wire.HeaderJobID] = []string{e.Job.ID}
	}
	if e.Job.Key != "" {
		h[wire.HeaderKey] = []string{e.Job.Key}
	}
	if e.Job.Type != "" {
		h[wire.HeaderType] = []string{e.Job.Type}
	}
	if e.Job.Reply != "" {
		h[wire.HeaderReply] = []string{e.Job.Reply}
	}
	if e.Job.KeepOutcome {
		h[wire.HeaderKeepOutcome] = oneHeader
	}
	if e.Job.Idempotent {
		h[wire.HeaderIdempotent] = oneHeader
	}
	return h
}

// oneHeader is the value of flag headers.
var oneHeader = []string{"1"}
