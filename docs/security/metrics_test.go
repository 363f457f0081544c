package security_test

import (
	"context"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/metrics"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The namespace gauges a worker command exports (metrics.NewNamespaces)
// read as the worker's user, which may neither list the account's
// streams nor a stream's consumers: worker-a still reports namespace a
// (its live worker, every partition owned), within the collector's bound,
// and nothing of namespace b.
func TestNamespaceGaugesAsWorker(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	w, err := keylane.NewWorker(wc.Conn, keylane.WorkerConfig{
		ID:       "worker-a-1",
		Topology: keylane.TopologyConfig{Namespace: "a", Partitions: 2, ReplyPrefix: "_INBOX.a."},
		Handler:  keylane.HandlerFunc(func(context.Context, keylane.Job) ([]byte, error) { return nil, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("worker-a: %v (%v)", err, wc.asyncErrs())
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	js, err := jetstream.New(wc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, "namespace a's gauges read as worker-a", func() bool {
		// A new collector each time: one reads at most every 10 s.
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewNamespaces(js, "a"))
		start := time.Now()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 6*time.Second {
			t.Fatalf("a scrape took %s, want within the collector's 5 s bound", took)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "namespace" && lp.GetValue() != "a" {
						t.Fatalf("worker-a reports namespace %q: %v", lp.GetValue(), m)
					}
				}
			}
		}
		n, _ := testutil.GatherAndCount(reg, "keylane_namespace_workers", "keylane_unowned_partitions")
		if n != 2 {
			return false
		}
		v := func(name string) float64 {
			for _, mf := range mfs {
				if mf.GetName() == name {
					return mf.GetMetric()[0].GetGauge().GetValue()
				}
			}
			return -1
		}
		return v("keylane_namespace_workers") == 1 && v("keylane_unowned_partitions") == 0
	})
}
