package statuspage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/statuspage"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	ns         = "shop"
	partitions = 2
	workerID   = "w-page"
	blocked    = 1 // the partition left with a backlog
	poisoned   = 0 // the partition with the dead letter
	backlog    = 3 // jobs queued behind the blocked one
	declined   = "card declined by the test"
)

// scene is a namespace as an operator finds it: worker w-page owns both
// partitions; partition 1 runs a job that does not finish, with three
// more of its key queued behind it; one job of partition 0 was
// dead-lettered.
type scene struct {
	srv        *server.Server
	js         jetstream.JetStream
	blockedKey string
	poisonKey  string
	poisonID   string
	// countKey's state entry holds the outcomes of count-1 and count-2,
	// which the handler applied through the worker's State.
	countKey string
}

// longPrefix makes the dead letter's key longer than the page shows.
const longPrefix = "customer-7f3a9c2e-4b1d-4e8a-9f6b-2c5d8e1a3b7f/cart/sku:"

func newScene(t *testing.T) *scene {
	t.Helper()
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	s := &scene{srv: srv, js: js, blockedKey: keyIn(blocked, "seat:"), poisonKey: keyIn(poisoned, longPrefix), poisonID: "order-666", countKey: keyIn(poisoned, "sku:")}
	var w *keylane.Worker
	w, err = keylane.NewWorker(natstest.Connect(t, srv), keylane.WorkerConfig{
		ID: workerID,
		// The default TTL: a headless chromium starting on a busy machine
		// must not cost the worker its leases (and the page its figures).
		Topology: keylane.TopologyConfig{Namespace: ns, Partitions: partitions, LeaseTTL: keylane.DefaultLeaseTTL},
		// A window of one job, and the least server window the worker
		// accepts beyond it: the jobs behind the blocked one stay on the
		// server, pending.
		MaxInFlight: 1,
		MaxPending:  2,
		Handler: keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
			switch string(j.Payload) {
			case "block":
				select { // a redelivery (after a lost lease) must not block here
				case started <- struct{}{}:
				default:
				}
				select {
				case <-release:
					return nil, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			case "poison":
				return nil, keylane.Permanent(errors.New(declined))
			case "count":
				return w.State().Apply(ctx, j, func(cur []byte) ([]byte, []byte, error) {
					n := len(cur) + 1
					return bytes.Repeat([]byte("x"), n), fmt.Appendf(nil, "counted %d", n), nil
				})
			}
			return nil, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
	t.Cleanup(func() { close(release) }) // runs before the Stop above
	testwait.Eventually(t, 10*time.Second, "the worker owns both partitions", func() bool { return len(w.Owned()) == partitions })

	c, err := keylane.NewClient(ctx, natstest.Connect(t, srv), keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.Call(ctx, s.poisonKey, []byte("poison"), keylane.WithID(s.poisonID)); err == nil {
		t.Fatal("the poison job succeeded")
	}
	for i := 1; i <= 2; i++ {
		if res, err := c.Call(ctx, s.countKey, []byte("count"), keylane.WithID(fmt.Sprintf("count-%d", i))); err != nil || string(res) != fmt.Sprintf("counted %d", i) {
			t.Fatalf("count-%d: %q, %v", i, res, err)
		}
	}
	// The blocked key's jobs go alone, each a batch of one: the worker
	// holds MaxInFlight of them, and the backlog stays on the server.
	submitAlone(ctx, t, js, ns, partitions, s.blockedKey, []byte("block"))
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the blocking job never started")
	}
	for i := range backlog {
		submitAlone(ctx, t, js, ns, partitions, s.blockedKey, fmt.Appendf(nil, "queued %d", i))
	}
	testwait.Eventually(t, 10*time.Second, fmt.Sprintf("Inspect shows %d pending on partition %d and one dead letter", backlog, blocked), func() bool {
		st, err := keylane.Inspect(ctx, js, ns)
		return err == nil && st.DeadLetters == 1 && st.Partition[blocked].Pending == backlog
	})
	return s
}

// aloneJobs numbers the batch IDs of the jobs submitAlone sends.
var aloneJobs atomic.Int64

// submitAlone stores a job of key in namespace (of n partitions, one
// shard: the tests' default) as a batch message of one, as a client sends
// a lone job, by hand (a test's own numbered batch ID), and waits for
// the stream's ack. A job that came alone counts in the worker's
// MaxInFlight window and is left on the server when the window is full.
func submitAlone(ctx context.Context, t *testing.T, js jetstream.JetStream, namespace string, n int, key string, payload []byte) {
	t.Helper()
	p := partition.Of(key, n)
	id := fmt.Sprintf("alone%017d", aloneJobs.Add(1))
	body, err := wire.EncodeBatch([]wire.BatchJob{{Key: key, ID: wire.BatchedJobID(id, 0), Payload: payload}})
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: wire.BatchSubject(namespace, p), Data: body, Header: nats.Header{
		wire.HeaderJobID: {id}, wire.HeaderBatch: {"1"}, wire.HeaderBatchJobs: {"1"}, wire.HeaderPartitions: {strconv.Itoa(n)},
		jetstream.ExpectedStreamHeader: {keylane.Names{Namespace: namespace}.JobsShard(0)},
	}}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("a batch of one of %s: %v", key, err)
	}
}

// serve serves the page on 127.0.0.1:0 until the test ends.
func serve(t *testing.T, js jetstream.JetStream, cfg statuspage.Config) *httptest.Server {
	t.Helper()
	h, err := statuspage.Handler(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/keylane/", http.StripPrefix("/keylane", h))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs
}

// keyIn returns a key that hashes to partition p.
func keyIn(p int, prefix string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if partition.Of(k, partitions) == p {
			return k
		}
	}
}
