package keylane

import (
	"context"
	"fmt"
	"time"

	"github.com/keylane/keylane/internal/client"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// DeadLetterReserve is the room Client leaves below max_payload in every
// job for what a dead letter adds (headers naming the error, attempts,
// worker, sequence, partition and fence).
const DeadLetterReserve = tenure.DeadLetterReserve

// ValidateJobID reports why id cannot be used as a job ID, or nil: 1 to
// 256 characters of A-Z a-z 0-9 _ - = and dots, a dot never first, last or
// next to another (the ID is a key of the results bucket). Workers apply
// the same rule (package wire) to every job they receive.
func ValidateJobID(id string) error { return client.ValidateJobID(id) }

// ClientConfig configures a Client.
type ClientConfig struct {
	// Namespace of the jobs stream. Defaults to "keylane".
	Namespace string
	// Partitions, when non-zero, must equal the stream's partition count;
	// a mismatch is refused with ErrPartitionMismatch. Defaults to 0: take
	// the count from the stream.
	Partitions int
	// StreamShards, when non-zero, must equal the namespace's number of
	// jobs stream shards; a mismatch is refused with ErrShardsMismatch.
	// Defaults to 0: take the count from the streams.
	StreamShards int
	// MaxPending bounds the asynchronous publishes in flight in SubmitMany.
	// Defaults to 4096.
	MaxPending int
	// TracerProvider turns tracing on: Submit, Call and SubmitMany start
	// a producer span and send its context in the job's headers, so the
	// worker's spans join the caller's trace (see the package doc,
	// "Tracing"). Defaults to nil: no span, no header, nothing allocated.
	// The global provider (otel.GetTracerProvider) is never used unless
	// passed here.
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context into job headers. Defaults to
	// W3C Trace Context (propagation.TraceContext{}, the traceparent and
	// tracestate headers). Used only with a TracerProvider.
	Propagator propagation.TextMapPropagator
	// BatchCork holds a job bound for a busy partition for up to this
	// long before its batch message goes, so the callers that come back
	// together once their batch is answered go as one message too: a
	// partition is busy when its previous batch message was sent less than
	// 4×BatchCork ago; after a quieter spell a job goes at once, as
	// without it. It trades up to BatchCork of latency for one message
	// (one fsync, one delivery, one transaction of an Applier) where there
	// would be two: worth about a millisecond on a server that syncs every
	// write (sync_interval: always), nothing on one that does not.
	// Defaults to 0: a job for a partition with nothing in flight goes at
	// once.
	BatchCork time.Duration
	// Observer receives the client's measurements (latency and outcome of
	// every Submit, Call and SubmitMany) for metrics; see package metrics.
	// Defaults to nil: nothing is measured.
	Observer *ClientObserver
}

// Client submits jobs. It is safe for concurrent use. Its engine is
// internal/client's; what is here opens the namespace, measures
// (ClientConfig.Observer) and serves the operator's Redrive.
type Client struct {
	e     *client.Client
	js    jetstream.JetStream
	names Names
	obs   *ClientObserver
}

// NewClient opens the namespace's jobs stream, checks its partition
// metadata, and returns a client. The connection stays the caller's.
func NewClient(ctx context.Context, nc *nats.Conn, cfg ClientConfig) (*Client, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultClientMaxPending
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	meta, err := Open(ctx, js, cfg.Namespace, cfg.Partitions)
	if err != nil {
		return nil, err
	}
	if cfg.StreamShards != 0 && cfg.StreamShards != meta.Shards {
		return nil, fmt.Errorf("%w: namespace %s has %d jobs stream shards, configured %d", ErrShardsMismatch, cfg.Namespace, meta.Shards, cfg.StreamShards)
	}
	names := Names{Namespace: cfg.Namespace}
	streams := make([]string, meta.Shards)
	for i := range streams {
		streams[i] = names.JobsShard(i)
	}
	e, err := client.New(client.Config{
		Conn: nc, JS: js, MaxPending: cfg.MaxPending,
		Namespace: cfg.Namespace, Partitions: meta.Partitions, Streams: streams,
		Shard:         func(p int) int { return ShardOf(p, meta.Shards) },
		ResultsBucket: names.Results(), ReplyPrefix: meta.ReplyPrefix,
		MaxKeyBacklog: meta.MaxKeyBacklog, Delays: meta.Delays,
		APIPrefix: apiPrefix(js), DeadLetterReserve: DeadLetterReserve,
		CheckStream: func(sc jetstream.StreamConfig) error {
			_, err := checkMeta(sc, meta.Partitions)
			return err
		},
		BatchCork: cfg.BatchCork,
		Tracing:   newClientTracing(cfg, nc),
	})
	if err != nil {
		return nil, err
	}
	return &Client{e: e, js: js, names: names, obs: cfg.Observer}, nil
}

// Partitions returns N, the partition count of the jobs stream.
func (c *Client) Partitions() int { return c.e.Partitions() }

// StreamShards returns S, the number of jobs stream shards.
func (c *Client) StreamShards() int { return c.e.StreamShards() }

// Request is one job to submit: Key, Payload, and optionally ID (the
// idempotency key; defaults to a new unique ID), Type (routes the job in
// a Mux), Headers (extra headers carried to the handler) and RunAt (when
// set, when the job joins its key's queue: WithRunAt; the zero time is
// now).
type Request = client.Request

// SubmitOpt sets a per-submit option.
type SubmitOpt func(*Request)

// WithID sets the job ID, the idempotency key: a second submit with the same
// ID within the stream's duplicate window stores nothing and returns the same
// ID.
func WithID(id string) SubmitOpt { return func(r *Request) { r.ID = id } }

// WithType sets the job type used by a Mux.
func WithType(typ string) SubmitOpt { return func(r *Request) { r.Type = typ } }

// WithHeader adds a header carried to the handler. Names under Nats-*
// (the server acts on them: a Nats-Rollup deletes the key's queued jobs)
// and Keylane-* (keylane's own), and Status and Description (nats.go's),
// are refused with ErrReservedHeader, a name nats.go cannot send or a
// value that would not arrive as sent (CR, LF, white space at either end)
// with ErrBadHeader; nothing is stored. Headers set in Request.Headers
// are checked the same way.
func WithHeader(k, v string) SubmitOpt {
	return func(r *Request) {
		if err := wire.ValidateUserHeader(k, v); err != nil {
			client.SetOptErr(r, err, true)
			return
		}
		if r.Headers == nil {
			r.Headers = nats.Header{}
		}
		r.Headers.Add(k, v)
	}
}

// withRedriveOf names the dead-lettered job a redrive replaces
// (Keylane-Redrive-Of): Client.Redrive's, next to its ticket.
func withRedriveOf(id string) SubmitOpt { return func(r *Request) { client.SetRedriveOf(r, id) } }

// withHeaders sets the job's headers to h as given, names unchanged (a
// redriven job of a batch: its headers as its submitter sent them);
// the client checks them as it checks Request.Headers.
func withHeaders(h map[string][]string) SubmitOpt {
	return func(r *Request) {
		if len(h) == 0 {
			return
		}
		r.Headers = make(nats.Header, len(h))
		for k, vs := range h {
			r.Headers[k] = append([]string(nil), vs...)
		}
	}
}

func build(key string, payload []byte, opts []SubmitOpt) Request {
	r := Request{Key: key, Payload: payload}
	for _, o := range opts {
		o(&r)
	}
	return r
}

// Submit stores a job and returns its ID once JetStream has stored it. It
// does not wait for the job to run. Bad input (an empty or oversized key, an
// oversized payload, a bad job ID) is refused before anything is sent. A
// publish the server refuses (a permissions violation for the job's
// subject) ends it with that refusal, errors.Is nats.ErrPermissionViolation
// (see internal/natserr's refusal.go for how, and its limits).
func (c *Client) Submit(ctx context.Context, key string, payload []byte, opts ...SubmitOpt) (_ string, err error) {
	defer c.observeSubmit(c.now(), &err)
	r := build(key, payload, opts)
	return c.e.Submit(ctx, &r)
}

// Call stores a job and waits for its handler's result. A handler error
// comes back as a *RemoteError. If ctx ends first, Call returns a
// *NoReplyError (errors.Is ErrNoReply and ctx.Err()). A job the worker
// holds until an operator acts (a re-created jobs stream, ErrEpoch) ends
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
// A Call travels in its partition's batch message (internal/client's callBatched), with
// or without WithID; on a namespace with a key backlog cap it goes alone,
// as a batch of one on its key's subject (alone), published again under
// its batch's ID until stored (the server drops a copy it has), each later
// copy marked for the worker to look the job's ID up before running it.
func (c *Client) Call(ctx context.Context, key string, payload []byte, opts ...SubmitOpt) (_ []byte, err error) {
	defer c.observeCall(c.now(), &err)
	r := build(key, payload, opts)
	return c.e.Call(ctx, &r)
}

// Submitted is the outcome of one job of SubmitMany: its ID, and its
// error (nil only if the stream acked it).
type Submitted = client.Submitted

// SubmitMany stores many jobs with at most MaxPending asynchronous publishes
// in flight, and returns once every one is stored or refused, in the order
// given. It returns an error only if ctx ended; per-job errors are in the
// slice, and a job has a nil Err only if the stream acked it.
func (c *Client) SubmitMany(ctx context.Context, reqs []Request) (out []Submitted, err error) {
	defer c.observeSubmitMany(c.now(), &out, &err)
	return c.e.SubmitMany(ctx, reqs)
}

// Result fetches a finished job's stored result from the results bucket:
// one request to the server (the bucket's handle is kept after the first).
// Workers store the result of every job only with StoreResults on, which
// costs one more KV write per job before its reply (batched with the
// group's other results, asynchronous, acked before the job is); jobs
// submitted WithID and every Call's job are kept in any case: by ID, or,
// for a Call that travelled in a batch (ClientConfig.Batches) to a
// worker with held outcomes, in its batch's entry, which its ID names
// (see "Batches on the wire" in package jetstream's doc); Result reads
// either.
//
// Result reads with a direct get of the key's subject, which any replica
// of the results stream answers (a client may read results only by key:
// docs/security.md, "Results read by key only"). On a replicated
// namespace a replica that has not yet applied an outcome kept a moment
// ago answers "none": right after its Call's reply, Result may return
// ErrNoResult for a job that finished. ErrNoResult is "none kept yet",
// never proof that the job did not run: read again, or submit it again
// WithID, which runs it at most once.
func (c *Client) Result(ctx context.Context, jobID string) ([]byte, error) {
	return c.e.Result(ctx, jobID)
}

// Stored returns how many messages the namespace's jobs streams hold,
// each a batch of one job or more stored and not yet settled: zero means
// every job stored has finished or been dead-lettered. It asks the server
// for the info of every shard's stream and reads no message, so it is the
// check to poll while a queue drains; Backlog counts the jobs.
func (c *Client) Stored(ctx context.Context) (uint64, error) { return c.stored(ctx, false) }

// Backlog returns how many jobs the namespace's streams hold: stored and
// not yet finished (a job leaves the stream when its handler finished and
// it was acked, or it was dead-lettered; a batch message's jobs leave
// with it). It asks the server for the info of every shard's stream and
// reads each stored batch message, up to 256 a shard (its
// Keylane-Batch-Jobs: a batch of 50 counts 50; the batch messages after
// those count one job each, so the figure is then a lower bound), and
// runs no job.
func (c *Client) Backlog(ctx context.Context) (uint64, error) { return c.stored(ctx, true) }

// stored sums the messages of every shard's jobs stream and, with jobs,
// the jobs their batch messages carry beyond the first (batchJobsBeyond).
func (c *Client) stored(ctx context.Context, jobs bool) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var n uint64
	for i := range c.e.StreamShards() {
		s, err := c.js.Stream(ctx, c.names.JobsShard(i))
		if err != nil {
			return 0, err
		}
		st := s.CachedInfo().State
		n += st.Msgs
		if !jobs || st.Msgs == 0 {
			continue
		}
		extra, err := batchJobsBeyond(ctx, s, allBatchesSubject(c.names.Namespace), st.FirstSeq-1, st.LastSeq)
		if err != nil {
			return 0, err
		}
		n += extra
	}
	return n, nil
}

// Close ends the client: Calls still waiting return ErrClosed at once,
// batch timers stop, and later calls return ErrClosed. It does not close
// the connection.
func (c *Client) Close() { c.e.Close() }
