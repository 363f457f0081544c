package keylane

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestKeptOutcomesBatchedOnACluster: on three nodes with R3, where
// batches are on by default (the server stages them in memory), a key's
// queued jobs with IDs are kept in batches, every outcome
// readable by ID from the stream's leader once the worker acked its job.
// Fails if the default leaves a replicated namespace without batches, or
// if R3 refuses them.
func TestKeptOutcomesBatchedOnACluster(t *testing.T) {
	r3 := startR3(t, "keptr3")
	conn, topo, cl, nc := r3.conn, r3.topo, r3.client, r3.nc
	const queued = 40
	reqs := make([]Request, queued)
	for i := range reqs {
		reqs[i] = Request{Key: "sku:r3", Payload: []byte("inc"), ID: fmt.Sprintf("r3-%d", i)}
	}
	out, err := cl.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	kw := watchKeptOn(t, conn(), topo.Names.Results())
	w := r3.worker(WorkerConfig{Reducer: newCounter(), ID: "r3w"})
	kw.waitSeen(t, "r3-", queued, false)
	// Seeing a put go by is not its being stored, and a direct get (the
	// KV's Get) may be answered by a follower that has not applied it
	// yet. The worker acks a job only after the stream acknowledged its
	// outcome: once it acked all, the leader has every outcome, and a
	// leader get cannot miss one.
	testwait.Eventually(t, 30*time.Second, "the worker acked every job", func() bool { return w.Stats().Succeeded >= queued })
	for _, r := range reqs {
		sm, err := leaderGet(ctx(t), nc, "KV_"+topo.Names.Results(), "$KV."+topo.Names.Results()+"."+r.ID)
		if err != nil {
			t.Fatalf("outcome of %s on the leader: %v", r.ID, err)
		}
		var bad *unreadableOutcomeError
		if k := keptValue(r.ID, sm.Header, sm.Data); k == nil || errors.As(k.err, &bad) {
			t.Fatalf("outcome of %s on the leader: %+v", r.ID, k)
		}
	}
	_, batched, commits, _ := kw.counts()
	t.Logf("%d outcomes, %d in batches, %d commits; worker %d batches, %d refused", queued, batched, commits, w.kept.Batches(), w.kept.Refused())
	// A refusal for a passing cause (a leader change mid-batch) may
	// happen on a loaded machine; a refusal in kind would leave no batch.
	if commits == 0 || w.kept.Batches() == 0 {
		t.Fatalf("R3: %d commits, %d batches, %d refused; want batches", commits, w.kept.Batches(), w.kept.Refused())
	}
}

// r3 is a three-node cluster with a namespace of one partition, every
// object R3, and a client on it.
type r3 struct {
	t      *testing.T
	c      *natscluster.Cluster
	nc     *nats.Conn
	topo   *Topology
	client *Client
}

// startR3 starts the cluster and sets namespace ns up on it.
func startR3(t *testing.T, ns string) *r3 {
	t.Helper()
	r := &r3{t: t, c: natscluster.Start(t, natscluster.Options{})}
	r.nc = r.conn()
	js, err := jetstream.New(r.nc)
	if err != nil {
		t.Fatal(err)
	}
	if r.topo, err = Setup(ctx(t), js, TopologyConfig{Namespace: ns, Partitions: 1, Replicas: 3, LeaseTTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if r.client, err = NewClient(ctx(t), r.nc, ClientConfig{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.client.Close)
	return r
}

// conn is a new connection to the cluster, closed when the test ends.
func (r *r3) conn() *nats.Conn {
	nc, err := nats.Connect(r.c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(nc.Close)
	return nc
}

// worker starts a worker of the namespace on its own connection (cfg's
// Topology set, a 10 ms backoff unless given), stopped when the test ends.
func (r *r3) worker(cfg WorkerConfig) *Worker {
	r.t.Helper()
	cfg.Topology = r.topo.Config
	if cfg.Backoff == nil {
		cfg.Backoff = func(int) time.Duration { return 10 * time.Millisecond }
	}
	w, err := NewWorker(r.conn(), cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := w.Start(ctx(r.t)); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
	return w
}
