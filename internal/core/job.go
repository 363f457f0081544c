package core

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Job is one unit of work as a handler sees it.
type Job struct {
	// ID is the job's idempotency key (the Nats-Msg-Id it was submitted with).
	ID string
	// Key is the resource key; jobs of one key never run at the same time.
	Key string
	// Type routes the job to a handler in a Mux; empty when not given.
	Type string
	// Payload is the submitted body.
	Payload []byte
	// Partition is the partition the key hashes to.
	Partition int
	// Seq is the job's stream sequence: jobs of one key run in Seq order.
	Seq uint64
	// Fence is the fencing token of the lease under which this run happens.
	// It strictly increases across owners of a partition. Stores outside
	// keylane should refuse writes carrying a fence lower than one they have
	// seen for the same key.
	Fence uint64
	// Attempt counts runs of this job, from 1; a job redelivered to a new
	// owner after its earlier owners started it starts above 1 (their
	// starts are counted across owners, see MaxDeliver).
	Attempt int
	// Headers are the message headers as submitted.
	Headers nats.Header

	trace any // the job's spans on this worker (the worker's type); nil when tracing is off
	// index is the job's place in its batch message (wire.ParseBatch), 0
	// for a one-job message: jobs of one batch share Seq.
	index int
}

// Index returns the job's place in its batch message ("Batches on the
// wire" in package jetstream's doc), 0 for a one-job message. Jobs of one
// batch share Seq; a key's jobs run in (Seq, Index) order.
func (j Job) Index() int { return j.index }

// Handler runs one job. The context is cancelled when the worker loses the
// partition's lease or shuts down hard; a handler that sees it cancelled
// should stop without side effects, since its result will not be acked.
// A returned error is retried in place with backoff; wrap it with Permanent
// to dead-letter at once.
type Handler interface {
	Handle(ctx context.Context, job Job) ([]byte, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job Job) ([]byte, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, job Job) ([]byte, error) { return f(ctx, job) }

// Mux routes jobs to handlers by Job.Type. An unknown type is a permanent
// error, so the job is dead-lettered and the caller of Call gets a clear
// error. Register handlers before the worker starts; Mux is not safe for
// concurrent registration.
type Mux struct {
	handlers map[string]Handler
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{handlers: map[string]Handler{}} }

// HandleType registers h for job type typ.
func (m *Mux) HandleType(typ string, h Handler) { m.handlers[typ] = h }

// Handle implements Handler.
func (m *Mux) Handle(ctx context.Context, job Job) ([]byte, error) {
	h, ok := m.handlers[job.Type]
	if !ok {
		return nil, Permanent(fmt.Errorf("%w %q", ErrUnknownType, job.Type))
	}
	return h.Handle(ctx, job)
}

// SetIndex sets the job's place in its batch message.
func SetIndex(j *Job, i int) { j.index = i }

// Trace returns what SetTrace attached to the job: its spans on this
// worker, nil when tracing is off.
func Trace(j Job) any { return j.trace }

// SetTrace attaches the job's spans on this worker.
func SetTrace(j *Job, t any) { j.trace = t }
