// Package security_test proves accounts.conf: a real server runs with it,
// and the real keylane Client and Worker connect as its users.
package security_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startServer runs a JetStream server with accounts.conf, each user's
// password its name and "-secret".
func startServer(t *testing.T) *server.Server {
	t.Helper()
	for _, user := range []string{"admin", "client-a", "worker-a", "client-b", "worker-b", "sys"} {
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", user+"-secret")
	}
	return natstest.StartConfig(t, "include ./accounts.conf\n", "accounts.conf")
}

// conn is a connection as one user of accounts.conf, with the inbox prefix
// of its namespace. Errors the server sends it asynchronously (permission
// violations) are kept in errs.
type conn struct {
	*nats.Conn
	mu   sync.Mutex
	errs []error
}

func (c *conn) asyncErrs() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.errs...)
}

func connect(t *testing.T, s *server.Server, user, inbox string) *conn {
	t.Helper()
	c := &conn{}
	opts := []nats.Option{
		nats.UserInfo(user, user+"-secret"),
		nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err)
			c.mu.Unlock()
		}),
	}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	return c
}

// startWorker runs a worker of namespace ns over c, with the reply prefix
// of accounts.conf; it appends each job's payload to its key's state.
func startWorker(ctx context.Context, c *conn, ns string) (*keylane.Worker, error) {
	w, err := keylane.NewWorker(c.Conn, keylane.WorkerConfig{
		Topology:     keylane.TopologyConfig{Namespace: ns, Partitions: 4, ReplyPrefix: "_INBOX." + ns + "."},
		StoreResults: true,
		OutcomeBatch: 2, // one replica here: batches are off by default
		Reducer: keylane.ReducerFunc(func(_ context.Context, job keylane.Job, state []byte) ([]byte, []byte, error) {
			state = append(state, job.Payload...)
			return state, state, nil
		}),
	})
	if err != nil {
		return nil, err
	}
	return w, w.Start(ctx)
}

// TestAccounts runs namespaces a and b side by side as accounts.conf's
// users: what each needs works, and every step out of its lane is refused
// with a permissions violation and leaves nothing behind.
func TestAccounts(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	workers := map[string]*conn{}
	clients := map[string]*keylane.Client{}
	for _, ns := range []string{"a", "b"} {
		wc := connect(t, s, "worker-"+ns, "_INBOX."+ns)
		w, err := startWorker(ctx, wc, ns)
		if err != nil {
			t.Fatalf("worker-%s: %v (%v)", ns, err, wc.asyncErrs())
		}
		t.Cleanup(func() { w.Stop(context.Background()) })
		workers[ns] = wc
		cc := connect(t, s, "client-"+ns, "_INBOX."+ns)
		cl, err := keylane.NewClient(ctx, cc.Conn, keylane.ClientConfig{Namespace: ns})
		if err != nil {
			t.Fatalf("client-%s: %v (%v)", ns, err, cc.asyncErrs())
		}
		t.Cleanup(cl.Close)
		clients[ns] = cl
		res, err := cl.Call(ctx, "k", []byte("x"))
		if err != nil || string(res) != "x" {
			t.Fatalf("client-%s Call: %q, %v (%v)", ns, res, err, cc.asyncErrs())
		}
		if _, err := cl.Submit(ctx, "k", []byte("y")); err != nil {
			t.Fatalf("client-%s Submit: %v (%v)", ns, err, cc.asyncErrs())
		}
		if res, err := cl.Call(ctx, "k", []byte("z")); err != nil || string(res) != "xyz" {
			t.Fatalf("client-%s Call after Submit: %q, %v", ns, res, err)
		}
		if err := errors.Join(wc.asyncErrs(), cc.asyncErrs()); err != nil {
			t.Fatalf("namespace %s: the allowed flow met refusals: %v", ns, err)
		}
	}

	// A Call retried by ID finds the first one's outcome kept in the
	// results bucket. client-a may read that bucket but not create a
	// consumer on it (a watch): the look-up must not wait on the refused
	// watch until the caller's deadline.
	t.Run("retried call", func(t *testing.T) {
		cl := clients["a"]
		first, err := cl.Call(ctx, "retried", []byte("r"), keylane.WithID("retried-1"))
		if err != nil {
			t.Fatalf("first Call: %v", err)
		}
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		start := time.Now()
		again, err := cl.Call(rctx, "retried", []byte("r"), keylane.WithID("retried-1"))
		if err != nil || string(again) != string(first) {
			t.Fatalf("Call retried by ID after %s: %q, %v; want the first outcome %q", time.Since(start).Round(time.Millisecond), again, err, first)
		}
		// The worker looked the job's ID up with a batched direct get on
		// the results stream's own subject, which worker-a may publish
		// (a refusal would only slow it down, so it is checked here).
		if err := workers["a"].asyncErrs(); err != nil {
			t.Fatalf("worker-a: %v", err)
		}
	})

	// The worker keeps a group's outcomes as one atomic batch: its Setup
	// may allow that on the results stream (STREAM.UPDATE), and the
	// batch's messages need no permission beyond the single puts'.
	t.Run("kept outcomes in batches", func(t *testing.T) {
		admin := connect(t, s, "admin", "")
		ajs, err := jetstream.New(admin.Conn)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := ajs.Stream(ctx, "KV_A_RESULTS")
		if err != nil || !rs.CachedInfo().Config.AllowAtomicPublish {
			t.Fatalf("KV_A_RESULTS does not allow atomic batches after worker-a's Setup (%v)", err)
		}
		var mu sync.Mutex
		puts, commits := 0, 0
		sub, err := admin.Subscribe("$KV.A_RESULTS.>", func(m *nats.Msg) {
			if !strings.HasPrefix(m.Subject, "$KV.A_RESULTS.burst-") {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			puts++
			if m.Header.Get("Nats-Batch-Commit") != "" {
				commits++
			}
		})
		if err == nil {
			err = admin.Flush()
		}
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		const burst = 200
		reqs := make([]keylane.Request, burst)
		for i := range reqs {
			reqs[i] = keylane.Request{Key: "burst", Payload: []byte("."), ID: fmt.Sprintf("burst-%d", i)}
		}
		if _, err := clients["a"].SubmitMany(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, 20*time.Second, "every burst outcome kept", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return puts >= burst
		})
		mu.Lock()
		defer mu.Unlock()
		if commits == 0 {
			t.Fatalf("%d jobs of one key submitted at once kept in %d puts, no batch", burst, puts)
		}
		if err := workers["a"].asyncErrs(); err != nil {
			t.Fatalf("worker-a met refusals keeping outcomes: %v", err)
		}
	})

	t.Run("unauthenticated", func(t *testing.T) {
		_, err := nats.Connect(s.ClientURL(), nats.Timeout(5*time.Second))
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect without a user: %v, want %v", err, nats.ErrAuthorization)
		}
	})

	forged := []byte("forged")
	for _, tc := range []struct {
		name, user, subject string
	}{
		{"client publishes to the dead-letter stream", "client-a", "a.dead.0"},
		{"client writes a lease", "client-a", "$KV.A_LEASES.p.0"},
		{"client writes state", "client-a", "$KV.A_STATE.k"},
		{"client writes membership", "client-a", "$KV.A_MEMBERS.forged"},
		{"client writes a result", "client-a", "$KV.A_RESULTS.forged"},
		{"client writes a redrive ticket", "client-a", "$KV.A_RESULTS.redrive/forged"},
		{"client acks a job", "client-a", "$JS.ACK.A_JOBS.p0.1.1.1.1.1.0"},
		{"client submits to another namespace", "client-a", "b.jobs.0.0123456789abcdef"},
		{"worker submits to another namespace", "worker-a", "b.jobs.0.0123456789abcdef"},
		{"worker dead-letters in another namespace", "worker-a", "b.dead.0"},
		{"worker writes another namespace's lease", "worker-a", "$KV.B_LEASES.p.0"},
		{"worker writes another namespace's state", "worker-a", "$KV.B_STATE.k"},
		{"worker replies into another namespace", "worker-a", "_INBOX.b.forged"},
	} {
		t.Run("publish/"+tc.name, func(t *testing.T) {
			c := connect(t, s, tc.user, "_INBOX."+tc.user[len(tc.user)-1:])
			js, err := jetstream.New(c.Conn)
			if err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err = js.Publish(pctx, tc.subject, forged)
			refused(t, c, err, `Permissions Violation for Publish to "`+tc.subject+`"`)
		})
	}

	for _, tc := range []struct {
		name, user, subject string
	}{
		{"client reads another namespace's jobs", "client-a", "b.jobs.*.*"},
		{"client reads another namespace's replies", "client-a", "_INBOX.b.>"},
		{"client reads every reply", "client-a", "_INBOX.>"},
		{"client reads its namespace's dead letters", "client-a", "a.dead.*"},
		{"worker reads another namespace's replies", "worker-a", "_INBOX.b.>"},
		{"worker reads another namespace's state", "worker-a", "$KV.B_STATE.>"},
	} {
		t.Run("subscribe/"+tc.name, func(t *testing.T) {
			c := connect(t, s, tc.user, "_INBOX."+tc.user[len(tc.user)-1:])
			sub, err := c.SubscribeSync(tc.subject)
			if err == nil {
				err = c.Flush()
			}
			if err == nil {
				_, err = sub.NextMsg(200 * time.Millisecond)
			}
			refused(t, c, err, `Permissions Violation for Subscription to "`+tc.subject+`"`)
		})
	}

	// A whole library call that steps out of its lane is refused too; the
	// server says why on the connection, the call ends with its context.
	for _, tc := range []struct {
		name, user, api string
		call            func(context.Context, *conn) error
	}{
		{"client opens another namespace", "client-a", "$JS.API.STREAM.INFO.B_JOBS", func(ctx context.Context, c *conn) error {
			_, err := keylane.NewClient(ctx, c.Conn, keylane.ClientConfig{Namespace: "b"})
			return err
		}},
		{"client opens the lease bucket", "client-a", "$JS.API.STREAM.INFO.KV_A_LEASES", func(ctx context.Context, c *conn) error {
			js, _ := jetstream.New(c.Conn)
			_, err := js.KeyValue(ctx, "A_LEASES")
			return err
		}},
		{"client consumes its namespace's jobs", "client-a", "$JS.API.CONSUMER.CREATE.A_JOBS", func(ctx context.Context, c *conn) error {
			js, _ := jetstream.New(c.Conn)
			_, err := js.CreateConsumer(ctx, "A_JOBS", jetstream.ConsumerConfig{Name: "forged"})
			return err
		}},
		{"worker runs another namespace", "worker-a", "$JS.API.", func(ctx context.Context, c *conn) error {
			w, err := startWorker(ctx, c, "b")
			if err == nil {
				w.Stop(context.Background())
			}
			return err
		}},
		{"worker deletes its jobs stream", "worker-a", "$JS.API.STREAM.DELETE.A_JOBS", func(ctx context.Context, c *conn) error {
			js, _ := jetstream.New(c.Conn)
			return js.DeleteStream(ctx, "A_JOBS")
		}},
	} {
		t.Run("call/"+tc.name, func(t *testing.T) {
			c := connect(t, s, tc.user, "_INBOX."+tc.user[len(tc.user)-1:])
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			refused(t, c, tc.call(cctx, c), `Permissions Violation for Publish to "`+tc.api)
		})
	}

	// Nothing forged was stored anywhere, and namespace b has no worker
	// but its own (an admin sees every stream of the account).
	admin := connect(t, s, "admin", "")
	js, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	streams := js.StreamNames(ctx)
	n := 0
	for name := range streams.Name() {
		n++
		for _, m := range natstest.StreamMsgs(t, js, name) {
			if string(m.Data) == string(forged) || strings.Contains(m.Subject, "forged") {
				t.Errorf("stream %s stored a refused message: %s %q", name, m.Subject, m.Data)
			}
		}
		if strings.HasSuffix(name, "_DEAD") {
			if msgs := natstest.StreamMsgs(t, js, name); len(msgs) > 0 {
				t.Errorf("dead-letter stream %s holds %d messages, want none", name, len(msgs))
			}
		}
	}
	if err := streams.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 12 {
		t.Errorf("%d streams, want 12: jobs, dead letters and four buckets for each of a and b", n)
	}
	kv, err := js.KeyValue(ctx, "B_MEMBERS")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		if e, err := kv.Get(ctx, k); err == nil && strings.Contains(string(e.Value()), "worker-a") {
			t.Errorf("worker-a became a member of namespace b: %s = %q", k, e.Value())
		}
	}
}

// refused checks that an action was refused: err is set, and the server
// told the connection why, naming what was refused.
func refused(t *testing.T, c *conn, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("not refused: %s", what)
	}
	testwait.Eventually(t, 5*time.Second, fmt.Sprintf("refused with %v, and the server says %s", err, what), func() bool {
		return strings.Contains(fmt.Sprint(c.asyncErrs()), what)
	})
}

// TestQueuedRetryOnAFullKeyIsUnknownToAClient: a client of accounts.conf
// may not read jobs, so when a retry by ID of its stored, queued order
// meets the key's full backlog after the duplicate window, it cannot
// prove the order is queued, and must not say "full, nothing stored"
// either: it says "unknown", naming the refusal, at once.
func TestQueuedRetryOnAFullKeyIsUnknownToAClient(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	js, err := jetstream.New(wc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "a", Partitions: 4, ReplyPrefix: "_INBOX.a.", MaxKeyBacklog: 1})
	if err != nil {
		t.Fatal(err)
	}
	info, err := topo.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc := info.Config
	sc.Duplicates = 100 * time.Millisecond
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	cc := connect(t, s, "client-a", "_INBOX.a")
	client, err := keylane.NewClient(ctx, cc.Conn, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Submit(ctx, "ticket:1", []byte("order-1"), keylane.WithID("order-1")); err != nil {
		t.Fatal(err)
	}
	var last error
	testwait.Eventually(t, 10*time.Second, "the retry meets the full key (the duplicate window passed)", func() bool {
		_, last = client.Submit(ctx, "ticket:1", []byte("order-1"), keylane.WithID("order-1"))
		return !errors.Is(last, keylane.ErrDuplicate)
	})
	if errors.Is(last, keylane.ErrKeyBacklogFull) || !strings.Contains(last.Error(), "unknown") || !errors.Is(last, nats.ErrPermissionViolation) {
		t.Fatalf("retry by ID of a queued order on a full key, as a client that may not read jobs: %v; want \"unknown\" naming the permissions violation, never backlog full", last)
	}
}

// startWorkerA starts a worker of namespace a as worker-a with handler h
// and a one-second lease, stopped when the test ends, and returns its
// connection (for its asynchronous errors) too.
func startWorkerA(ctx context.Context, t *testing.T, s *server.Server, partitions int, h keylane.Handler, mod func(*keylane.WorkerConfig)) (*keylane.Worker, *conn) {
	t.Helper()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	cfg := keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "a", Partitions: partitions, ReplyPrefix: "_INBOX.a.", LeaseTTL: time.Second},
		Handler:  h,
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := keylane.NewWorker(wc.Conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("worker-a: %v (%v)", err, wc.asyncErrs())
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	return w, wc
}

// clientA opens a client of namespace a as client-a, closed when the test
// ends.
func clientA(ctx context.Context, t *testing.T, s *server.Server) (*keylane.Client, *conn) {
	t.Helper()
	cc := connect(t, s, "client-a", "_INBOX.a")
	cl, err := keylane.NewClient(ctx, cc.Conn, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl, cc
}
