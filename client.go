package keylane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ValidateJobID reports why id cannot be used as a job ID, or nil: 1 to
// 256 characters of A-Z a-z 0-9 _ - = and dots, a dot never first, last or
// next to another (the ID is a key of the results bucket). Workers apply
// the same rule (package wire) to every job they receive.
func ValidateJobID(id string) error {
	if wire.ValidateJobID(id) != nil {
		return fmt.Errorf("%w (got %q)", ErrBadJobID, id)
	}
	return nil
}

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

// Client submits jobs. It is safe for concurrent use.
type Client struct {
	// reconnected is closed, and replaced, each time the connection is
	// re-established: one listener per client (watchReconnects), not one
	// per Call, whose StatusChanged takes the connection's lock twice.
	reconnected atomic.Pointer[chan struct{}]

	nc      *nats.Conn
	js      jetstream.JetStream
	async   jetstream.JetStream
	names   Names
	n       int
	shards  int
	expect  [][]string // the Nats-Expected-Stream header value, by shard, shared
	nHeader []string   // the Keylane-Partitions header value, shared

	replyPrefix string // the topology's: workers reply nowhere else
	// maxKeyBacklog is the namespace's per-key cap (0: none), named in
	// KeyBacklogFullError.
	maxKeyBacklog int64
	delays        bool // the namespace takes delayed jobs

	mu      sync.Mutex
	inbox   string
	sub     *nats.Subscription
	waiters map[string]*waiter
	closed  bool
	done    chan struct{} // closed by Close: every waiting call ends
	token   atomic.Uint64
	wire    *wireBatcher // every job but a delayed one, a redrive, or one on a capped namespace
	results jetstream.KeyValue
	obs     *ClientObserver
	tracing *clientTracing // nil: tracing off

	// beforeBatch, if set (tests only), sees every batch message of two
	// jobs or more just before its first publish.
	beforeBatch func(*nats.Msg)
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
	if cfg.BatchCork < 0 {
		return nil, fmt.Errorf("keylane: ClientConfig.BatchCork %s is negative", cfg.BatchCork)
	}
	n := meta.Partitions
	async, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
	if err != nil {
		return nil, err
	}
	names := Names{Namespace: cfg.Namespace}
	c := &Client{nc: nc, js: js, async: async, names: names, n: n, shards: meta.Shards, replyPrefix: meta.ReplyPrefix, maxKeyBacklog: meta.MaxKeyBacklog, delays: meta.Delays, nHeader: []string{strconv.Itoa(n)}, waiters: map[string]*waiter{}, done: make(chan struct{}), obs: cfg.Observer}
	for i := range c.shards {
		c.expect = append(c.expect, []string{names.JobsShard(i)})
	}
	if c.wire, err = newWireBatcher(c, cfg.BatchCork); err != nil {
		return nil, err
	}
	c.tracing = newClientTracing(cfg, nc)
	c.watchReconnects()
	return c, nil
}

// watchReconnects keeps c.reconnected until the client or its connection
// is closed.
func (c *Client) watchReconnects() {
	ch := make(chan struct{})
	c.reconnected.Store(&ch)
	status := c.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	go func() {
		defer c.nc.RemoveStatusListener(status)
		for {
			select {
			case st, ok := <-status:
				if !ok || st == nats.CLOSED {
					return
				}
				next := make(chan struct{})
				close(*c.reconnected.Swap(&next))
			case <-c.done:
				return
			}
		}
	}()
}

// Partitions returns N, the partition count of the jobs stream.
func (c *Client) Partitions() int { return c.n }

// StreamShards returns S, the number of jobs stream shards.
func (c *Client) StreamShards() int { return c.shards }

// Request is one job to submit.
type Request struct {
	Key     string
	Payload []byte
	// ID is the job ID (idempotency key). Defaults to a new unique ID.
	ID string
	// Type routes the job in a Mux. Optional.
	Type string
	// Headers are extra headers carried to the handler. Optional.
	Headers nats.Header
	// RunAt, when set, is when the job joins its key's queue (WithRunAt).
	// Optional: the zero time is now.
	RunAt time.Time

	optErr    error  // an option's refusal
	redriveOf string // Client.Redrive's Keylane-Redrive-Of (withRedriveOf)
}

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
			if r.optErr == nil {
				r.optErr = err
			}
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
func withRedriveOf(id string) SubmitOpt { return func(r *Request) { r.redriveOf = id } }

// withHeaders sets the job's headers to h as given, names unchanged (a
// redriven job of a batch: its headers as its submitter sent them);
// Client.message checks them as it checks Request.Headers.
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

func (c *Client) message(r *Request, reply string) (*nats.Msg, error) {
	// Each field by the rule the worker applies on receipt (package wire).
	if r.optErr != nil {
		return nil, r.optErr
	}
	if err := wire.ValidateKey(r.Key); err != nil {
		return nil, err
	}
	if err := wire.ValidateType(r.Type); err != nil {
		return nil, err
	}
	if err := wire.ValidateUserHeaders(r.Headers); err != nil {
		return nil, err
	}
	if reply != "" {
		if err := wire.ValidateReply(reply, c.replyPrefix); err != nil {
			return nil, err
		}
	}
	explicit := r.ID != ""
	if !explicit {
		r.ID = newID() // unguessable: see randid.go
	} else if err := ValidateJobID(r.ID); err != nil {
		return nil, err
	}
	p := partition.Of(r.Key, c.n)
	m := &nats.Msg{Subject: partition.Subject(c.names.Namespace, p, r.Key), Data: r.Payload, Header: make(nats.Header, 4+len(r.Headers))}
	for k, vs := range r.Headers {
		m.Header[k] = append([]string(nil), vs...)
	}
	// Our header names are canonical: set them without Header.Set's work.
	m.Header[HeaderJobID] = []string{r.ID}
	m.Header[HeaderKey] = []string{r.Key}
	m.Header[HeaderPartitions] = c.nHeader
	// The subject decides the shard's stream; the server refuses the job
	// if it would land in any other.
	m.Header[expectStreamHeader] = c.expect[ShardOf(p, c.shards)]
	if r.Type != "" {
		m.Header[HeaderType] = []string{r.Type}
	}
	if r.redriveOf != "" {
		m.Header[HeaderRedriveOf] = []string{r.redriveOf}
	}
	if err := c.delay(r, m, p); err != nil {
		return nil, err
	}
	if reply != "" {
		m.Header[HeaderReply] = []string{reply}
	}
	if explicit {
		// The caller may retry with this ID: the worker keeps its outcome
		// by ID (see ClientConfig's doc on retries).
		m.Header[HeaderIdempotent] = oneHeader
	}
	// Headers cost bytes too; leave room for the server's own.
	size := len(m.Data) + len(m.Subject) + 64
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	// Leave room for what a dead letter adds, so a failing job can always
	// be dead-lettered.
	if max := c.nc.MaxPayload() - DeadLetterReserve; int64(size) > max {
		return nil, fmt.Errorf("%w: %d bytes with headers, limit %d (max_payload less %d for a dead letter's headers)", ErrPayloadTooLarge, size, max, DeadLetterReserve)
	}
	return m, nil
}

func build(key string, payload []byte, opts []SubmitOpt) Request {
	r := Request{Key: key, Payload: payload}
	for _, o := range opts {
		o(&r)
	}
	return r
}

// Backlog returns how many jobs the namespace's streams hold: stored and
// not yet finished (a job leaves the stream when its handler finished and
// it was acked, or it was dead-lettered; a batch message's jobs leave
// with it). It asks the server for the info of every shard's stream and
// reads each stored batch message, up to 256 a shard (its
// Keylane-Batch-Jobs: a batch of 50 counts 50; the batch messages after
// those count one job each, so the figure is then a lower bound), and
// runs no job.
func (c *Client) Backlog(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var n uint64
	for _, e := range c.expect {
		s, err := c.js.Stream(ctx, e[0])
		if err != nil {
			return 0, err
		}
		st := s.CachedInfo().State
		n += st.Msgs
		if st.Msgs == 0 {
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
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.done)
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
	c.mu.Unlock()
	if c.wire != nil {
		// Queued jobs end with ErrClosed; a batch in flight ends at once
		// too (its publish sees c.done).
		_ = c.wire.Close(context.Background())
	}
}
