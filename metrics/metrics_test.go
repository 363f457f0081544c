package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollectorReportsWorkerCounters(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		ID:       "m1",
		Topology: keylane.TopologyConfig{Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, j keylane.Job) ([]byte, error) {
			return j.Payload, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 3; i++ {
		if _, err := c.Call(ctx, "k", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// A Call returns with its reply; the worker counts the job once acked.
	testwait.Eventually(t, 10*time.Second, "the worker counts 3 jobs", func() bool { return w.Stats().Succeeded == 3 })
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(w))
	want := `
# HELP keylane_jobs_succeeded_total Jobs acked after success.
# TYPE keylane_jobs_succeeded_total counter
keylane_jobs_succeeded_total{worker="m1"} 3
# HELP keylane_partitions_owned Partitions whose lease this worker still trusts.
# TYPE keylane_partitions_owned gauge
keylane_partitions_owned{worker="m1"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "keylane_jobs_succeeded_total", "keylane_partitions_owned"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 24 {
		t.Fatalf("gathered %d metrics, %v; want 24 (17 counters, partitions owned, 3 gauges for each of 2 partitions)", n, err)
	}
}
