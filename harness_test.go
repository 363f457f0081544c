package keylane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// env is one test's server, namespace and client.
type env struct {
	t      *testing.T
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	ns     string
	topo   *Topology
	client *Client
}

func newEnv(t *testing.T, tc TopologyConfig) *env {
	t.Helper()
	srv := natstest.Start(t)
	return newEnvOn(t, srv, natstest.Connect(t, srv), tc)
}

// newEnvOn is newEnv on a server the test configured itself (users,
// limits), with the setup and the client on connection nc.
func newEnvOn(t *testing.T, srv *server.Server, nc *nats.Conn, tc TopologyConfig) *env {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if tc.Partitions == 0 {
		tc.Partitions = 4
	}
	if tc.LeaseTTL == 0 {
		tc.LeaseTTL = time.Second
	}
	topo, err := Setup(ctx(t), js, tc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), nc, ClientConfig{Namespace: topo.Names.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &env{t: t, srv: srv, nc: nc, js: js, ns: topo.Names.Namespace, topo: topo, client: c}
}

// submitAll stores reqs with SubmitMany and fails the test unless every
// one was stored.
func (e *env) submitAll(reqs []Request) {
	e.t.Helper()
	out, err := e.client.SubmitMany(ctx(e.t), reqs)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			e.t.Fatal(o.Err)
		}
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// worker starts a worker on its own connection; it is stopped gracefully
// when the test ends unless the test stopped it.
func (e *env) worker(id string, h Handler, mod func(*WorkerConfig)) *Worker {
	e.t.Helper()
	nc := natstest.Connect(e.t, e.srv)
	cfg := WorkerConfig{
		Topology: e.topo.Config,
		Handler:  h,
		ID:       id,
		AckWait:  5 * time.Second,
		Backoff:  func(int) time.Duration { return 10 * time.Millisecond },
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if mod != nil {
		mod(&cfg)
	}
	return startWorker(e.t, nc, cfg)
}

// startWorker starts a worker on nc with cfg (with -v and no Logger, a
// debug logger naming it), stopped gracefully when the test ends unless
// the test stopped it.
func startWorker(t *testing.T, nc *nats.Conn, cfg WorkerConfig) *Worker {
	t.Helper()
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("worker", cfg.ID)
	}
	w, err := NewWorker(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
	return w
}

// proxiedConn connects to url through a fault proxy, reconnecting at
// once and for ever (opts add to that); both are closed when the test
// ends.
func proxiedConn(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, *faultproxy.Proxy) {
	t.Helper()
	p, err := faultproxy.New(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), nats.ReconnectJitter(0, 0)}, opts...)
	nc, err := nats.Connect(p.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, p
}

// waitOwned waits until the workers together own every partition.
func (e *env) waitOwned(ws ...*Worker) {
	e.t.Helper()
	testwait.Eventually(e.t, 10*time.Second, "every partition owned", func() bool {
		seen := map[int]bool{}
		for _, w := range ws {
			for _, p := range w.Owned() {
				if seen[p] {
					return false // two owners during a hand-over: wait
				}
				seen[p] = true
			}
		}
		return len(seen) == e.topo.Partitions
	})
}

func (e *env) streamMsgs(name string) uint64 {
	e.t.Helper()
	s, err := e.js.Stream(ctx(e.t), name)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

// deadLetters returns the messages on the dead-letter stream.
func (e *env) deadLetters() []*jetstream.RawStreamMsg {
	e.t.Helper()
	return natstest.StreamMsgs(e.t, e.js, e.topo.Names.Dead())
}

// keyIn returns a key that hashes to partition p.
func keyIn(p, n int, prefix string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if partition.Of(k, n) == p {
			return k
		}
	}
}

// restartable is an embedded server whose store and port survive restart,
// and its reconnecting clients.
type restartable struct {
	t   *testing.T
	cfg embedded.Config
	srv *server.Server
}

func startRestartable(t *testing.T, name string) *restartable {
	t.Helper()
	r := &restartable{t: t, cfg: embedded.Config{Port: -1, StoreDir: t.TempDir(), ServerName: name}}
	r.start()
	r.cfg.Port = r.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { r.srv.Shutdown(); r.srv.WaitForShutdown() })
	return r
}

func (r *restartable) start() {
	r.t.Helper()
	srv, err := embedded.Start(r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	r.srv = srv
}

// connect returns a client that reconnects across restarts.
func (r *restartable) connect() *nats.Conn {
	r.t.Helper()
	nc, err := nats.Connect(r.srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

// restart shuts the server down and starts it again on its port and store.
func (r *restartable) restart() {
	r.t.Helper()
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
	r.start()
}
