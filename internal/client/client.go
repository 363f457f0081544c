package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/tracing"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ValidateJobID reports why id cannot be used as a job ID, or nil
// (keylane.ValidateJobID).
func ValidateJobID(id string) error {
	if wire.ValidateJobID(id) != nil {
		return fmt.Errorf("%w (got %q)", core.ErrBadJobID, id)
	}
	return nil
}

// Config is everything a Client is built from: the connection and the
// facts of the namespace it was opened on, each explicit (the root opens
// the namespace and fills them in).
type Config struct {
	// Conn is the caller's connection; the client never closes it.
	Conn *nats.Conn
	// JS is a JetStream context on Conn.
	JS jetstream.JetStream
	// MaxPending bounds the asynchronous publishes in flight in
	// SubmitMany (keylane.ClientConfig defaults it); jetstream refuses
	// one below 1.
	MaxPending int
	// Namespace names the jobs' subjects.
	Namespace string
	// Partitions is N, the jobs stream's partition count.
	Partitions int
	// Streams are the jobs streams' names, by shard: every job message
	// carries its shard's in Nats-Expected-Stream.
	Streams []string
	// Shard is the shard (an index of Streams) of partition p.
	Shard func(p int) int
	// ResultsBucket is the KV bucket where workers keep outcomes.
	ResultsBucket string
	// ReplyPrefix is the namespace's: workers reply nowhere else.
	ReplyPrefix string
	// MaxKeyBacklog is the namespace's per-key cap (0: none).
	MaxKeyBacklog int64
	// Delays: the namespace takes delayed jobs.
	Delays bool
	// APIPrefix is JS's JetStream API prefix ("$JS.API." by default),
	// for the message gets of a full key's queue (queued).
	APIPrefix string
	// DeadLetterReserve is what a job leaves of max_payload for the
	// headers a dead letter adds.
	DeadLetterReserve int
	// CheckStream refuses a jobs stream's configuration that routes with
	// another partition count than Partitions (core.ErrPartitionMismatch), or
	// that is no keylane stream.
	CheckStream func(jetstream.StreamConfig) error
	// BatchCork is keylane.ClientConfig.BatchCork, checked (>= 0).
	BatchCork time.Duration
	// Tracing makes the send spans; nil: tracing off.
	Tracing *tracing.Client
}

// Client is the engine of keylane.Client: it builds, batches and
// publishes jobs, and waits for their acks and replies. It is safe for
// concurrent use.
type Client struct {
	// reconnected is closed, and replaced, each time the connection is
	// re-established: one listener per client (watchReconnects), not one
	// per Call, whose StatusChanged takes the connection's lock twice.
	reconnected atomic.Pointer[chan struct{}]

	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	async   jetstream.JetStream
	n       int
	expect  [][]string // the Nats-Expected-Stream header value, by shard, shared
	nHeader []string   // the Keylane-Partitions header value, shared

	replyPrefix string // the topology's: workers reply nowhere else
	// maxKeyBacklog is the namespace's per-key cap (0: none), named in
	// core.KeyBacklogFullError.
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
	tracing *tracing.Client // nil: tracing off

	// beforeBatch, if set (tests only), sees every batch message of two
	// jobs or more just before its first publish.
	beforeBatch func(*nats.Msg)
	// beforeAlone, if set (tests only), sees every batch of one Client.alone
	// builds before it is sent.
	beforeAlone func(*nats.Msg)
}

// New returns a client of the namespace cfg describes. A Config missing
// what a client cannot work without is refused, not left to fail later.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.Conn == nil || cfg.JS == nil:
		return nil, errors.New("keylane: client: Config needs Conn and JS")
	case cfg.Partitions < 1 || len(cfg.Streams) < 1 || cfg.Shard == nil:
		return nil, fmt.Errorf("keylane: client: Config needs Partitions (%d), Streams (%d) and Shard", cfg.Partitions, len(cfg.Streams))
	case cfg.CheckStream == nil || cfg.ResultsBucket == "" || cfg.Namespace == "":
		return nil, errors.New("keylane: client: Config needs CheckStream, ResultsBucket and Namespace")
	}
	if cfg.BatchCork < 0 {
		return nil, fmt.Errorf("keylane: ClientConfig.BatchCork %s is negative", cfg.BatchCork)
	}
	async, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
	if err != nil {
		return nil, err
	}
	n := cfg.Partitions
	c := &Client{cfg: cfg, nc: cfg.Conn, js: cfg.JS, async: async, n: n, replyPrefix: cfg.ReplyPrefix, maxKeyBacklog: cfg.MaxKeyBacklog, delays: cfg.Delays, nHeader: []string{strconv.Itoa(n)}, waiters: map[string]*waiter{}, done: make(chan struct{}), tracing: cfg.Tracing}
	for _, s := range cfg.Streams {
		c.expect = append(c.expect, []string{s})
	}
	if c.wire, err = newWireBatcher(c, cfg.BatchCork); err != nil {
		return nil, err
	}
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
func (c *Client) StreamShards() int { return len(c.expect) }

// Request is one job to submit (keylane.Request).
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

// OptErr returns the refusal an option recorded on r, or nil.
func OptErr(r *Request) error { return r.optErr }

// SetOptErr records an option's refusal on r: the request is refused
// with it, nothing sent. The first one stays unless first is false.
func SetOptErr(r *Request, err error, first bool) {
	if first && r.optErr != nil {
		return
	}
	r.optErr = err
}

// SetRedriveOf names the dead-lettered job r replaces
// (Keylane-Redrive-Of).
func SetRedriveOf(r *Request, id string) { r.redriveOf = id }

var oneHeader = []string{"1"}

func (c *Client) message(r *Request, reply string) (*nats.Msg, error) {
	if r.optErr != nil {
		return nil, r.optErr
	}
	// Each field by the rule the worker applies on receipt (package wire).
	if err := wire.ValidateJob(wire.BatchJob{Key: r.Key, ID: r.ID, Type: r.Type, Reply: reply, Header: r.Headers}, c.replyPrefix); err != nil {
		if errors.Is(err, wire.ErrBadJobID) {
			return nil, fmt.Errorf("%w (got %q)", core.ErrBadJobID, r.ID) // as ValidateJobID says it
		}
		return nil, err
	}
	explicit := r.ID != ""
	if !explicit {
		r.ID = NewID() // unguessable: see randid.go
	}
	p := partition.Of(r.Key, c.n)
	m := &nats.Msg{Subject: partition.Subject(c.cfg.Namespace, p, r.Key), Data: r.Payload, Header: make(nats.Header, 4+len(r.Headers))}
	for k, vs := range r.Headers {
		m.Header[k] = append([]string(nil), vs...)
	}
	// Our header names are canonical: set them without Header.Set's work.
	m.Header[wire.HeaderJobID] = []string{r.ID}
	m.Header[wire.HeaderKey] = []string{r.Key}
	m.Header[wire.HeaderPartitions] = c.nHeader
	// The subject decides the shard's stream; the server refuses the job
	// if it would land in any other.
	m.Header[jetstream.ExpectedStreamHeader] = c.expect[c.cfg.Shard(p)]
	if r.Type != "" {
		m.Header[wire.HeaderType] = []string{r.Type}
	}
	if r.redriveOf != "" {
		m.Header[wire.HeaderRedriveOf] = []string{r.redriveOf}
	}
	if err := c.delay(r, m, p); err != nil {
		return nil, err
	}
	if reply != "" {
		m.Header[wire.HeaderReply] = []string{reply}
	}
	if explicit {
		// The caller may retry with this ID: the worker keeps its outcome
		// by ID (see ClientConfig's doc on retries).
		m.Header[wire.HeaderIdempotent] = oneHeader
	}
	// Headers cost bytes too (MessageSize leaves room for the server's
	// own); leave room for what a dead letter adds, so a failing job can
	// always be dead-lettered.
	if max, size := c.nc.MaxPayload()-int64(c.cfg.DeadLetterReserve), core.MessageSize(m); size > max {
		return nil, fmt.Errorf("%w: %d bytes with headers, limit %d (max_payload less %d for a dead letter's headers)", core.ErrPayloadTooLarge, size, max, c.cfg.DeadLetterReserve)
	}
	return m, nil
}

// Close ends the client: Calls still waiting return core.ErrClosed at once,
// batch timers stop, and later calls return core.ErrClosed. It does not close
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
		// Queued jobs end with core.ErrClosed; a batch in flight ends at once
		// too (its publish sees c.done).
		_ = c.wire.Close(context.Background())
	}
}
