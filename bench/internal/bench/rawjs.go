package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/inventory"
)

// Names of the raw limit's rows.
const (
	rawRR = "raw JS request-reply"
	rawPC = "raw JS publish+consume"
)

// The raw limit: one stream, one subject, one pull consumer, no keylane.
const (
	rawStream   = "BENCH_RAW"
	rawSubject  = "bench.raw"
	rawConsumer = "raw"
	rawKey      = "Bench-Key"
	rawReply    = "Bench-Reply"
)

// rawSale is the raw JetStream limit: purchases published to a bare
// stream, applied to an in-memory counter by one consumer that replies
// (request-reply) or only acks (publish+consume, with bulk set).
type rawSale struct {
	bulk bool

	srv      *natsServer    // separate
	consumer *child         // separate
	embedded *server.Server // embedded
	dir      string         // embedded store
	stop     context.CancelFunc
	served   chan error // embedded consumer's exit
	conns    []*nats.Conn
	q        *rawQueue
	pids     [2]int
}

func (r *rawSale) Name() string {
	if r.bulk {
		return rawPC
	}
	return rawRR
}

func (r *rawSale) Kind() Kind { return Limit }

func (r *rawSale) Setup(ctx context.Context, env Env) error {
	var url string
	if env.Placement == Embedded {
		var err error
		if r.dir, err = os.MkdirTemp("", "keylane-bench-raw-"); err != nil {
			return err
		}
		r.embedded, err = embedded.Start(embedded.Config{Port: -1, StoreDir: r.dir, SyncAlways: env.Durable, ServerName: "bench-raw"})
		if err != nil {
			return err
		}
		url = r.embedded.ClientURL()
		nc, err := r.connect(url)
		if err != nil {
			return err
		}
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r.stop, r.served = cancel, make(chan error, 1)
		ready := make(chan struct{})
		go func() { r.served <- serveRaw(sctx, nc, func() { close(ready) }) }()
		select {
		case <-ready:
		case err := <-r.served:
			r.served <- err
			return fmt.Errorf("raw consumer: %w", err)
		}
		r.pids = [2]int{0, os.Getpid()}
	} else {
		var err error
		if r.srv, err = startNATSServer(ctx, env.NATSServer, env.Durable); err != nil {
			return err
		}
		url = r.srv.URL
		if r.consumer, err = startChild(ctx, "ready", env.Exe, "rawjs", "--nats", url); err != nil {
			return fmt.Errorf("start raw consumer: %w", err)
		}
		r.pids = [2]int{r.srv.pid(), r.consumer.pid()}
	}
	nc, err := r.connect(url)
	if err != nil {
		return err
	}
	r.q, err = newRawQueue(nc)
	return err
}

func (r *rawSale) connect(url string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name("keylane-bench-raw"))
	if err == nil {
		r.conns = append(r.conns, nc)
	}
	return nc, err
}

func (r *rawSale) Run(ctx context.Context, w Workload) (Result, error) {
	return sell(ctx, w, queueShop{r.q}, r.bulk, r.pids[0], r.pids[1])
}

func (r *rawSale) Teardown(context.Context) {
	if r.q != nil {
		r.q.close()
	}
	if r.stop != nil {
		r.stop()
		<-r.served
	}
	for _, nc := range r.conns {
		nc.Close()
	}
	if r.consumer != nil {
		r.consumer.stop(10 * time.Second)
	}
	if r.srv != nil {
		r.srv.Stop()
	}
	if r.embedded != nil {
		r.embedded.Shutdown()
		r.embedded.WaitForShutdown()
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
	*r = rawSale{bulk: r.bulk}
}

// serveRaw creates the raw stream and consumer on nc and applies the
// inventory commands it carries to an in-memory stock, one at a time in
// stream order, until ctx ends. A command with a reply header is answered
// before it is acked. ready is called once it consumes.
func serveRaw(ctx context.Context, nc *nats.Conn, ready func()) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: rawStream, Subjects: []string{rawSubject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return err
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: rawConsumer, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return err
	}
	stock := map[string]int64{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		out := applyRaw(stock, m.Headers().Get(rawKey), m.Data())
		if reply := m.Headers().Get(rawReply); reply != "" {
			_ = nc.Publish(reply, out)
		}
		_ = m.Ack()
	})
	if err != nil {
		return err
	}
	ready()
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	return nil
}

// applyRaw applies one inventory command to stock and returns the reply
// keylane's inventory handler would give.
func applyRaw(stock map[string]int64, key string, payload []byte) []byte {
	cmd, err := inventory.Parse(payload)
	if err != nil {
		return []byte(err.Error())
	}
	n := stock[key]
	switch cmd.Op {
	case "set":
		stock[key] = cmd.N
		return []byte("ok " + strconv.FormatInt(cmd.N, 10))
	case "buy":
		if n < cmd.N {
			return []byte("soldout " + strconv.FormatInt(n, 10))
		}
		stock[key] = n - cmd.N
		return []byte("sold " + strconv.FormatInt(n-cmd.N, 10))
	case "get":
		return []byte("stock " + strconv.FormatInt(n, 10))
	}
	return []byte("unsupported " + cmd.Op)
}

// ServeRawJS runs the raw JetStream consumer against the NATS server at url
// until ctx ends. It prints "ready" to out once it consumes. It is the
// hidden "rawjs" subcommand that the separate placement runs in a child
// process.
func ServeRawJS(ctx context.Context, url string, out io.Writer) error {
	if url == "" {
		return errors.New("bench: rawjs needs --nats")
	}
	nc, err := nats.Connect(url, nats.Name("keylane-bench-raw-consumer"))
	if err != nil {
		return err
	}
	defer nc.Close()
	return serveRaw(ctx, nc, func() { fmt.Fprintln(out, "ready") })
}

// rawQueue publishes to the raw stream; a call waits for the consumer's
// reply on an inbox of its own, named in a header. It is safe for
// concurrent use.
type rawQueue struct {
	nc        *nats.Conn
	js, async jetstream.JetStream
	inbox     string
	sub       *nats.Subscription
	token     atomic.Uint64

	mu      sync.Mutex
	waiters map[string]chan []byte
}

func newRawQueue(nc *nats.Conn) (*rawQueue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	async, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(submitChunk))
	if err != nil {
		return nil, err
	}
	q := &rawQueue{nc: nc, js: js, async: async, inbox: nc.NewInbox() + ".", waiters: map[string]chan []byte{}}
	q.sub, err = nc.Subscribe(q.inbox+"*", func(m *nats.Msg) {
		q.mu.Lock()
		ch := q.waiters[m.Subject[len(q.inbox):]]
		q.mu.Unlock()
		select {
		case ch <- m.Data:
		default: // no waiter, or a duplicate reply of a redelivered message
		}
	})
	if err != nil {
		return nil, err
	}
	_ = q.sub.SetPendingLimits(-1, -1)
	return q, nil
}

func (q *rawQueue) msg(key string, payload []byte) *nats.Msg {
	m := nats.NewMsg(rawSubject)
	m.Data = payload
	m.Header.Set(rawKey, key)
	return m
}

func (q *rawQueue) call(ctx context.Context, key string, payload []byte, _ string) ([]byte, error) {
	token := strconv.FormatUint(q.token.Add(1), 36)
	ch := make(chan []byte, 1)
	q.mu.Lock()
	q.waiters[token] = ch
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		delete(q.waiters, token)
		q.mu.Unlock()
	}()
	m := q.msg(key, payload)
	m.Header.Set(rawReply, q.inbox+token)
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		return nil, err
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (q *rawQueue) submit(ctx context.Context, keys []string, payload []byte, _ []string) error {
	futures := make([]jetstream.PubAckFuture, 0, len(keys))
	for _, k := range keys {
		f, err := q.async.PublishMsgAsync(q.msg(k, payload))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (q *rawQueue) backlog(ctx context.Context) (uint64, error) {
	s, err := q.js.Stream(ctx, rawStream)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.Msgs, nil
}

func (q *rawQueue) close() { _ = q.sub.Unsubscribe() }
