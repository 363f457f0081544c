package keylane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// ValidateJobID reports why id cannot be used as a job ID, or nil.
func ValidateJobID(id string) error {
	ok := len(id) >= 1 && len(id) <= 256 && id[0] != '.' && id[len(id)-1] != '.'
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '=' || c == '-' || c == '.'
	}
	if !ok {
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
	// AtomicBatches coalesces concurrent Calls and Submits into JetStream
	// atomic batches (server 2.12 or later), one batch in flight at a time
	// per few, so a server that fsyncs every write (sync_interval: always)
	// syncs once per batch instead of once per job. On a server with the
	// default sync interval it costs more than it saves; leave it off there.
	AtomicBatches bool
}

// Client submits jobs. It is safe for concurrent use.
type Client struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	async    jetstream.JetStream
	names    Names
	n        int
	shards   int
	subjects []string   // partition subjects, by partition
	expect   [][]string // the Nats-Expected-Stream header value, by shard, shared
	nHeader  []string   // the Keylane-Partitions header value, shared

	replyPrefix string // the topology's: workers reply nowhere else

	mu      sync.Mutex
	inbox   string
	sub     *nats.Subscription
	waiters map[string]*waiter
	closed  bool
	done    chan struct{} // closed by Close: every waiting call ends
	token   atomic.Uint64
	batch   []*batcher // by shard (an atomic batch stays in one stream); nil unless AtomicBatches
	results jetstream.KeyValue
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
	n := meta.Partitions
	async, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
	if err != nil {
		return nil, err
	}
	names := Names{Namespace: cfg.Namespace}
	c := &Client{nc: nc, js: js, async: async, names: names, n: n, shards: meta.Shards, replyPrefix: meta.ReplyPrefix, nHeader: []string{strconv.Itoa(n)}, waiters: map[string]*waiter{}, done: make(chan struct{})}
	for i := range c.shards {
		c.expect = append(c.expect, []string{names.JobsShard(i)})
		if cfg.AtomicBatches {
			c.batch = append(c.batch, newBatcher(c))
		}
	}
	c.subjects = make([]string, n)
	for p := range n {
		c.subjects[p] = partition.Subject(cfg.Namespace, p)
	}
	return c, nil
}

// Partitions returns N, the partition count of the jobs stream.
func (c *Client) Partitions() int { return c.n }

// StreamShards returns S, the number of jobs stream shards.
func (c *Client) StreamShards() int { return c.shards }

// batcherOf returns the group-commit batcher of m's shard.
func (c *Client) batcherOf(m *nats.Msg) *batcher {
	for i, e := range c.expect {
		if m.Header[expectStreamHeader][0] == e[0] {
			return c.batch[i]
		}
	}
	return c.batch[0]
}

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
}

// SubmitOpt sets a per-submit option.
type SubmitOpt func(*Request)

// WithID sets the job ID, the idempotency key: a second submit with the same
// ID within the stream's duplicate window stores nothing and returns the same
// ID.
func WithID(id string) SubmitOpt { return func(r *Request) { r.ID = id } }

// WithType sets the job type used by a Mux.
func WithType(typ string) SubmitOpt { return func(r *Request) { r.Type = typ } }

// WithHeader adds a header carried to the handler.
func WithHeader(k, v string) SubmitOpt {
	return func(r *Request) {
		if r.Headers == nil {
			r.Headers = nats.Header{}
		}
		r.Headers.Add(k, v)
	}
}

func (c *Client) message(r *Request, reply string) (*nats.Msg, error) {
	if err := partition.ValidateKey(r.Key); err != nil {
		return nil, err
	}
	explicit := r.ID != ""
	if !explicit {
		r.ID = nuid.Next()
	} else if err := ValidateJobID(r.ID); err != nil {
		return nil, err
	}
	p := partition.Of(r.Key, c.n)
	m := &nats.Msg{Subject: c.subjects[p], Data: r.Payload, Header: make(nats.Header, 4+len(r.Headers))}
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

// Submit stores a job and returns its ID once JetStream has stored it. It
// does not wait for the job to run. Bad input (an empty or oversized key, an
// oversized payload, a bad job ID) is refused before anything is sent.
func (c *Client) Submit(ctx context.Context, key string, payload []byte, opts ...SubmitOpt) (string, error) {
	r := build(key, payload, opts)
	m, err := c.message(&r, "")
	if err != nil {
		return "", err
	}
	if c.batch == nil {
		dup, err := c.publish(ctx, m)
		if err != nil {
			return "", fmt.Errorf("keylane: submit %s: %w", r.ID, err)
		}
		if dup {
			return r.ID, fmt.Errorf("%w (job %s)", ErrDuplicate, r.ID)
		}
		return r.ID, nil
	}
	token, w, err := c.wait()
	if err != nil {
		return "", err
	}
	defer c.unwait(token)
	c.batcherOf(m).publish(m, token)
	select {
	case ack := <-w.ack:
		dup, err := pubAckError(ack)
		if err != nil {
			return "", fmt.Errorf("keylane: submit %s: %w", r.ID, err)
		}
		if dup {
			return r.ID, fmt.Errorf("%w (job %s)", ErrDuplicate, r.ID)
		}
		return r.ID, nil
	case <-ctx.Done():
		return "", fmt.Errorf("keylane: submit %s: no stream ack: %w", r.ID, ctx.Err())
	case <-c.done:
		return "", fmt.Errorf("keylane: submit %s: no stream ack: %w", r.ID, ErrClosed)
	}
}

// Call stores a job and waits for its handler's result. A handler error
// comes back as a *RemoteError. If ctx ends first, Call returns a
// *NoReplyError (errors.Is ErrNoReply and ctx.Err()).
//
// Retries: a Call with the same WithID as an earlier one returns that
// job's outcome, at once if it finished, when it finishes if it still runs,
// and never runs it twice. Within the server's duplicate window the stream
// drops the second publish and Call waits on the outcome the worker keeps
// by ID (jobs with a caller's ID have their outcome stored in the results
// bucket, for ResultsTTL); after it, the worker answers the new message
// from the kept outcome.
func (c *Client) Call(ctx context.Context, key string, payload []byte, opts ...SubmitOpt) ([]byte, error) {
	r := build(key, payload, opts)
	token, w, err := c.wait()
	if err != nil {
		return nil, err
	}
	defer c.unwait(token)
	m, err := c.message(&r, c.inbox+token)
	if err != nil {
		return nil, err
	}
	// The worker keeps a Call's outcome by ID, so a reply lost with a
	// connection is recovered from it.
	m.Header[HeaderKeepOutcome] = oneHeader
	// Publish without waiting for the stream's ack: it comes to our inbox
	// like the result does, and only an error in it matters. The result
	// itself proves the job was stored. This saves a blocking round trip
	// per call and the request machinery of a synchronous publish.
	status := c.nc.StatusChanged(nats.CONNECTED)
	defer c.nc.RemoveStatusListener(status)
	publish := func(m *nats.Msg) {
		if c.batch != nil {
			c.batcherOf(m).publish(m, token)
			return
		}
		m.Reply = c.inbox + ackPrefix + token
		// A failed publish (disconnected, buffer full) is like a lost one:
		// the ack timer publishes again.
		_ = c.nc.PublishMsg(m)
	}
	publish(m)
	// No stream ack within ackWait: the publish, or its ack, was lost (a
	// reconnect, a stream leader change). Publish again with the same job
	// ID; the stream drops it if it has the job, and the copy asks the
	// worker to look the ID up before running it.
	ackWait := callAckWait
	ackTimer := time.NewTimer(ackWait)
	defer ackTimer.Stop()
	acked := false
	republish := func() {
		again := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: maps.Clone(m.Header)}
		again.Header[HeaderIdempotent] = oneHeader
		publish(again)
		ackWait = min(2*ackWait, maxCallAckWait)
		ackTimer.Reset(ackWait)
	}
	var recovered chan outcome
	rctx, stopRecovery := context.WithCancel(ctx)
	var recovery sync.WaitGroup
	defer func() { stopRecovery(); recovery.Wait() }() // no watcher outlives Call
	recover := func() {
		if recovered == nil {
			recovered = make(chan outcome, 1)
			recovery.Go(func() {
				res, err := c.awaitOutcome(rctx, r.ID)
				recovered <- outcome{res, err}
			})
		}
	}
	// A stored job whose reply has not come within replyWait may have lost
	// it on the worker's side (a reply sent while its connection or lease
	// was failing): look for the kept outcome as well.
	replyTimer := time.NewTimer(time.Hour)
	replyTimer.Stop()
	defer replyTimer.Stop()
	for {
		select {
		case ack := <-w.ack:
			dup, err := pubAckError(ack)
			if errors.Is(err, jetstream.ErrNoStreamResponse) {
				// No stream leader right now (an election: the timer
				// publishes again), or no stream at all (say so at once).
				if c.streamGone(ctx, m) {
					return nil, fmt.Errorf("keylane: submit %s: %w: %w", r.ID, err, ErrNoTopology)
				}
				if !acked {
					ackTimer.Reset(noLeaderPause)
				}
				continue
			}
			if err != nil {
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
			recover()
		case <-ackTimer.C:
			if !acked {
				republish()
			}
		case <-status:
			// The reply may have been lost while we were away: look for
			// the kept outcome too, and publish again if unacked.
			if !acked {
				republish()
			}
			recover()
		case o := <-recovered:
			return o.res, o.err
		case reply := <-w.result:
			return decodeReply(reply)
		case <-ctx.Done():
			return nil, &NoReplyError{JobID: r.ID, Err: ctx.Err()}
		case <-c.done:
			return nil, fmt.Errorf("keylane: call %s: %w", r.ID, ErrClosed)
		}
	}
}

// streamGone reports whether the jobs stream m goes to does not exist (as
// opposed to having no leader for a moment).
func (c *Client) streamGone(ctx context.Context, m *nats.Msg) bool {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, err := c.js.Stream(ctx, m.Header.Get(expectStreamHeader))
	return errors.Is(err, jetstream.ErrStreamNotFound)
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
// still runs. It watches the key and also reads it with bounded requests
// every outcomePoll, so a watch that stalls while the bucket elects a
// leader (a cluster) does not make the caller wait out its deadline.
func (c *Client) awaitOutcome(ctx context.Context, id string) ([]byte, error) {
	var kv jetstream.KeyValue
	var updates <-chan jetstream.KeyValueEntry
	poll := time.NewTimer(0)
	defer poll.Stop()
	var stopWatch func()
	defer func() {
		if stopWatch != nil {
			stopWatch()
		}
	}()
	for {
		var e jetstream.KeyValueEntry
		select {
		case u, ok := <-updates:
			if !ok {
				updates = nil // closed: keep polling
				continue
			}
			e = u
		case <-poll.C:
			poll.Reset(outcomePoll)
			if kv == nil {
				// The bucket may be electing a leader: try again next time.
				var err error
				if kv, err = c.resultsBucket(ctx); err != nil {
					continue
				}
				if watch, err := kv.Watch(ctx, id); err == nil {
					stopWatch = func() { _ = watch.Stop() }
					updates = watch.Updates()
				}
			}
			gctx, cancel := context.WithTimeout(ctx, requestTimeout)
			got, err := kv.Get(gctx, id)
			cancel()
			if err == nil {
				e = got
			}
		case <-ctx.Done():
			return nil, &NoReplyError{JobID: id, Err: ctx.Err()}
		case <-c.done:
			return nil, fmt.Errorf("keylane: outcome of %s: %w", id, ErrClosed)
		}
		if e == nil || e.Operation() != jetstream.KeyValuePut {
			continue
		}
		res, rerr, ok := decodeResult(e.Value())
		if !ok {
			return nil, fmt.Errorf("keylane: malformed stored result for %s", id)
		}
		return res, rerr
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
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	kv, err := c.js.KeyValue(rctx, c.names.Results())
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
	ack    chan *nats.Msg
	result chan *nats.Msg
}

func (c *Client) wait() (string, *waiter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, ErrClosed
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
	token := strconv.FormatUint(c.token.Add(1), 36)
	w := &waiter{ack: make(chan *nats.Msg, 1), result: make(chan *nats.Msg, 1)}
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
	if rest, ok := strings.CutPrefix(token, ackPrefix); ok {
		if id, ok := strings.CutPrefix(rest, batchPrefix); ok && c.batch != nil {
			for _, b := range c.batch {
				b.done(id, m) // only the batcher that sent it knows id
			}
			return
		}
		c.deliverTo(rest, m)
		return
	}
	c.deliverTo(token, m)
}

// deliverTo hands m to token's waiter: an ack (its subject carries the ack
// prefix) or the result. Extra ones (re-publishes, redelivered jobs) are
// dropped: the first one won.
func (c *Client) deliverTo(token string, m *nats.Msg) {
	c.mu.Lock()
	w := c.waiters[token]
	c.mu.Unlock()
	if w == nil {
		return
	}
	ch := w.result
	if strings.HasPrefix(m.Subject[min(len(c.inbox), len(m.Subject)):], ackPrefix) {
		ch = w.ack
	}
	select {
	case ch <- m:
	default:
	}
}

// Submitted is the outcome of one job of SubmitMany.
type Submitted struct {
	ID  string
	Err error
}

// SubmitMany stores many jobs with at most MaxPending asynchronous publishes
// in flight, and returns once every one is stored or refused, in the order
// given. It returns an error only if ctx ended; per-job errors are in the
// slice.
func (c *Client) SubmitMany(ctx context.Context, reqs []Request) ([]Submitted, error) {
	out := make([]Submitted, len(reqs))
	futures := make([]jetstream.PubAckFuture, len(reqs))
	for i := range reqs {
		m, err := c.message(&reqs[i], "")
		out[i].ID = reqs[i].ID
		if err != nil {
			out[i].Err = err
			continue
		}
		f, err := c.async.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			out[i].Err = err
			continue
		}
		futures[i] = f
		if ctx.Err() != nil {
			break
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if !retryablePublish(err) {
				out[i].Err = err
				continue
			}
			// Lost with a connection or a leader: publish it again, with
			// its ID, until it is stored or ctx ends.
			if _, err := c.publish(ctx, f.Msg()); err != nil {
				out[i].Err = err
			}
		case <-ctx.Done():
			return out, ctx.Err()
		case <-c.done:
			return out, ErrClosed
		}
	}
	return out, ctx.Err()
}

// publish stores m and waits for the stream's ack, publishing it again with
// backoff (its job ID makes that safe) while the failure is one a
// reconnect or an election cures, until ctx ends. Each attempt is bounded.
// It reports whether the stream had the job already.
func (c *Client) publish(ctx context.Context, m *nats.Msg) (dup bool, err error) {
	pause := 50 * time.Millisecond
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, requestTimeout)
		ack, err := c.js.PublishMsg(actx, m)
		cancel()
		if err == nil {
			return ack.Duplicate, nil
		}
		if !retryablePublish(err) || ctx.Err() != nil {
			return false, err
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) && c.streamGone(ctx, m) {
			return false, fmt.Errorf("%w: %w", err, ErrNoTopology)
		}
		if try == 1 {
			// A copy that may follow an earlier one asks the worker to
			// look its ID up before running it.
			m.Header[HeaderIdempotent] = oneHeader
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-c.done:
			t.Stop()
			return false, ErrClosed
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// retryablePublish tells failures that publishing again may cure: no
// stream leader, a timeout, a connection being re-established.
func retryablePublish(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrNoResponders)
}

// Backlog returns how many jobs the namespace's streams hold: stored and
// not yet finished (a job leaves the stream when its handler finished and
// it was acked, or it was dead-lettered). It asks the server for the info
// of every shard's stream and runs no job.
func (c *Client) Backlog(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var n uint64
	for _, e := range c.expect {
		s, err := c.js.Stream(ctx, e[0])
		if err != nil {
			return 0, err
		}
		n += s.CachedInfo().State.Msgs
	}
	return n, nil
}

// Close ends the client: Calls still waiting return ErrClosed at once,
// batch timers stop, and later calls return ErrClosed. It does not close
// the connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	close(c.done)
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
	for _, b := range c.batch {
		b.close()
	}
}
