package statuspage_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/statuspage"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBacklogCountsJobsOfBatches: a one-job message and a batch message
// of 50 jobs waiting behind a job that does not finish are a backlog of
// 51 on the page, not 2.
func TestBacklogCountsJobsOfBatches(t *testing.T) {
	const space = "batched"
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	release := make(chan struct{})
	w, err := keylane.NewWorker(natstest.Connect(t, srv), keylane.WorkerConfig{
		ID:       workerID,
		Topology: keylane.TopologyConfig{Namespace: space, Partitions: 1, LeaseTTL: keylane.DefaultLeaseTTL},
		// A window of one job: the one running holds it, and what is
		// stored after stays pending.
		MaxInFlight: 1,
		MaxPending:  2,
		Handler: keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
			select {
			case <-release:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
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
	testwait.Eventually(t, 10*time.Second, "the worker owns the partition", func() bool { return len(w.Owned()) == 1 })
	// The two held jobs go alone, each a batch of one: with MaxInFlight 1
	// the second stays on the server behind the one running. The backlog
	// is then a batch of one and a batch of 50.
	for _, key := range []string{"seat:0", "seat:9"} {
		submitAlone(ctx, t, js, space, 1, key, []byte("held"))
	}
	testwait.Eventually(t, 10*time.Second, "one job running, the other pending", func() bool {
		st, err := keylane.Inspect(ctx, js, space)
		return err == nil && st.Partition[0].InFlight == 1 && st.Partition[0].Pending == 1
	})
	var jobs []wire.BatchJob
	for i := range 50 {
		jobs = append(jobs, wire.BatchJob{Key: "seat:" + strconv.Itoa(i%5+1), ID: "b-" + strconv.Itoa(i)})
	}
	body, err := wire.EncodeBatch(jobs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: wire.BatchSubject(space, 0), Data: body, Header: nats.Header{
		wire.HeaderJobID: {"batch-1"}, wire.HeaderBatch: {"1"}, wire.HeaderBatchJobs: {"50"}, wire.HeaderPartitions: {"1"},
	}}); err != nil {
		t.Fatal(err)
	}
	hs := serve(t, js, statuspage.Config{Namespace: space, Worker: workerID, MaxAge: time.Millisecond})
	testwait.Eventually(t, 10*time.Second, "the page's backlog of 51", func() bool {
		code, body, _ := get(t, http.MethodGet, hs.URL+"/keylane/status.json")
		var p statuspage.Page
		return code == http.StatusOK && json.Unmarshal([]byte(body), &p) == nil && p.Status != nil && p.Status.Partition[0].Pending == 51
	})
}
