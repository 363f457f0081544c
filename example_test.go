package keylane_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Seats are booked through keylane: two buyers race for seat A7, the jobs
// run one at a time on the partition owner, and the worker stores each
// seat's holder, applying each booking exactly once.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "keylane-example-")
	defer os.RemoveAll(dir)
	srv, _ := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	// A Reducer turns a seat's holder and a job into the new holder and
	// the job's result. It has no other side effect, so the worker can
	// group-commit a hot seat's queued jobs with one state write.
	book := keylane.ReducerFunc(func(ctx context.Context, job keylane.Job, holder []byte) ([]byte, []byte, error) {
		if holder != nil {
			return holder, []byte("taken by " + string(holder)), nil
		}
		return job.Payload, []byte("booked"), nil
	})
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Reducer: book})
	_ = w.Start(ctx)
	defer w.Stop(ctx)

	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	for _, who := range []string{"ann", "bob"} {
		res, err := c.Call(ctx, "seat:A7", []byte(who))
		fmt.Println(who, string(res), err)
	}
	// Output:
	// ann booked <nil>
	// bob taken by ann <nil>
}

// startExample runs an embedded server for an example; stop it with the
// returned function.
func startExample() (*nats.Conn, func()) {
	dir, _ := os.MkdirTemp("", "keylane-example-")
	srv, _ := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	nc, _ := nats.Connect(srv.ClientURL())
	return nc, func() {
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		os.RemoveAll(dir)
	}
}

// A Handler with outside side effects keeps its own per-key state with
// State.Apply: each job's update is stored once, fenced, even if the job
// is delivered again after a crash.
func ExampleState_Apply() {
	ctx := context.Background()
	nc, stop := startExample()
	defer stop()

	var visits *keylane.State // the worker's State: the handler needs no Setup before NewWorker
	count := keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		return visits.Apply(ctx, job, func(cur []byte) (next, result []byte, err error) {
			next = append(cur, '+')
			return next, []byte(fmt.Sprintf("%d visits", len(next))), nil
		})
	})
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Handler: count})
	visits = w.State()
	_ = w.Start(ctx)
	defer w.Stop(ctx)

	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	defer c.Close()
	for range 2 {
		res, err := c.Call(ctx, "page:home", nil)
		fmt.Println(string(res), err)
	}
	// Output:
	// 1 visits <nil>
	// 2 visits <nil>
}

// A Mux routes jobs to handlers by their Type; an unknown type fails
// permanently (dead-lettered, never retried).
func ExampleMux() {
	ctx := context.Background()
	nc, stop := startExample()
	defer stop()

	mux := keylane.NewMux()
	mux.HandleType("hold", keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		return []byte("held " + job.Key), nil
	}))
	mux.HandleType("release", keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		return []byte("released " + job.Key), nil
	}))
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Handler: mux})
	_ = w.Start(ctx)
	defer w.Stop(ctx)

	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	defer c.Close()
	for _, typ := range []string{"hold", "release", "upgrade"} {
		res, err := c.Call(ctx, "seat:B2", nil, keylane.WithType(typ))
		fmt.Printf("%s: %s %v\n", typ, res, errors.Is(err, keylane.ErrPermanent))
	}
	// Output:
	// hold: held seat:B2 false
	// release: released seat:B2 false
	// upgrade:  true
}

// SubmitMany stores many jobs with one round of asynchronous publishes and
// reports each job's ID or error; a bad request fails alone.
func ExampleClient_SubmitMany() {
	ctx := context.Background()
	nc, stop := startExample()
	defer stop()

	// Setup creates the namespace; SubmitMany only stores jobs, so no
	// worker needs to run.
	js, _ := jetstream.New(nc)
	_, _ = keylane.Setup(ctx, js, keylane.TopologyConfig{})
	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	defer c.Close()
	out, err := c.SubmitMany(ctx, []keylane.Request{
		{Key: "sku:1", ID: "order-1", Payload: []byte("buy 1")},
		{Key: "", ID: "order-2", Payload: []byte("buy 1")},
		{Key: "sku:2", ID: "order-3", Payload: []byte("buy 2")},
	})
	fmt.Println(err)
	for _, s := range out {
		fmt.Println(s.ID, s.Err != nil)
	}
	backlog, _ := c.Backlog(ctx)
	fmt.Println("stored", backlog)
	// Output:
	// <nil>
	// order-1 false
	// order-2 true
	// order-3 false
	// stored 2
}

// A handler error wrapped in Permanent is not retried: the job is
// dead-lettered at once and its caller gets a RemoteError that says so.
func ExamplePermanent() {
	ctx := context.Background()
	nc, stop := startExample()
	defer stop()

	h := keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		if string(job.Payload) == "" {
			return nil, keylane.Permanent(errors.New("empty order"))
		}
		return []byte("ok"), nil
	})
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Handler: h})
	_ = w.Start(ctx)
	defer w.Stop(ctx)

	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	defer c.Close()
	_, err := c.Call(ctx, "sku:9", nil)
	var re *keylane.RemoteError
	if errors.As(err, &re) {
		fmt.Println(re.Message, re.Permanent, re.DeadLettered)
	}
	// Output:
	// empty order true true
}

// A secured server needs nothing of keylane: connect as the namespace's
// user and hand the connection over. With docs/security/accounts.conf,
// client-a may take replies only under _INBOX.a, the reply prefix its
// namespace was created with (a worker sets TopologyConfig.ReplyPrefix to
// "_INBOX.a."). Not run: it needs that server.
func ExampleNewClient_secured() {
	ctx := context.Background()
	nc, err := nats.Connect("tls://nats.example:4222",
		nats.UserInfo("client-a", os.Getenv("NATS_PASSWORD")), // or nats.UserCredentials("client-a.creds")
		nats.RootCAs("ca.pem"),
		nats.CustomInboxPrefix("_INBOX.a"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	res, err := c.Call(ctx, "seat:A7", []byte("ann"))
	fmt.Println(string(res), err)
}
