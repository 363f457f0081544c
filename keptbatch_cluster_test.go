package keylane

import (
	"context"
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
	c := natscluster.Start(t, natscluster.Options{})
	conn := func() *nats.Conn {
		nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc := conn()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), js, TopologyConfig{Namespace: "keptr3", Partitions: 1, Replicas: 3, LeaseTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := NewClient(ctx(t), nc, ClientConfig{Namespace: "keptr3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
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
	w, err := NewWorker(conn(), WorkerConfig{
		Topology: topo.Config, Reducer: newCounter(), ID: "r3w",
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	})
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
	kw.waitSeen(t, "r3-", queued, false)
	// Seeing a put go by is not its being stored, and a direct get (the
	// KV's Get) may be answered by a follower that has not applied it
	// yet. The worker acks a job only after the stream acknowledged its
	// outcome: once it acked all, the leader has every outcome, and a
	// leader get cannot miss one.
	testwait.Eventually(t, 30*time.Second, "the worker acked every job", func() bool { return w.Stats().Succeeded >= queued })
	for _, r := range reqs {
		sm, err := leaderGet(ctx(t), nc, "KV_"+topo.Names.Results(), "$KV."+topo.Names.Results()+"."+r.ID)
		if err != nil || keptValue(sm.Header, sm.Data) == nil {
			t.Fatalf("outcome of %s on the leader: %v", r.ID, err)
		}
	}
	_, batched, commits, _ := kw.counts()
	t.Logf("%d outcomes, %d in batches, %d commits; worker %d batches, %d refused", queued, batched, commits, w.kept.batches.Load(), w.kept.refused.Load())
	// A refusal for a passing cause (a leader change mid-batch) may
	// happen on a loaded machine; a refusal in kind would leave no batch.
	if commits == 0 || w.kept.batches.Load() == 0 {
		t.Fatalf("R3: %d commits, %d batches, %d refused; want batches", commits, w.kept.batches.Load(), w.kept.refused.Load())
	}
}
