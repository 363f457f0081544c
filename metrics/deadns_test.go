package metrics

import (
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Two namespaces on one server, a worker each. The worker of "na" dies
// (its connection closed: it renews nothing more, releases nothing), and
// the process of "nb", through NewNamespaces, reports "na": no live
// worker and every partition unowned as soon as the dead worker's
// entries lapse (two thirds of the lease TTL by the server's clock),
// before the server removes them (a TTL); then a job submitted to "na"
// shows as lag, with its age growing and its store time.
func TestAnotherNamespacesProcessReportsADeadNamespace(t *testing.T) {
	srv := natstest.Start(t)
	ncA, ncB, ncC := natstest.Connect(t, srv), natstest.Connect(t, srv), natstest.Connect(t, srv)
	ttl := 6 * time.Second
	wa, err := keylane.NewWorker(ncA, keylane.WorkerConfig{ID: "a1", Topology: keylane.TopologyConfig{Namespace: "na", Partitions: 2, LeaseTTL: ttl}, Handler: echo})
	if err != nil {
		t.Fatal(err)
	}
	wb, err := keylane.NewWorker(ncB, keylane.WorkerConfig{ID: "b1", Topology: keylane.TopologyConfig{Namespace: "nb", Partitions: 2, LeaseTTL: ttl}, Handler: echo})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*keylane.Worker{wa, wb} {
		if err := w.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = wb.Stop(t.Context()) })
	jsB, err := jetstream.New(ncB)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	n := NewNamespaces(jsB, "nb")
	n.every = 0
	reg.MustRegister(n)
	na, nb := map[string]string{"namespace": "na"}, map[string]string{"namespace": "nb"}
	testwait.Eventually(t, 20*time.Second, "both namespaces reported: a live worker each, every partition owned", func() bool {
		return value(t, reg, "keylane_namespace_workers", na) == 1 && value(t, reg, "keylane_namespace_workers", nb) == 1 &&
			value(t, reg, "keylane_unowned_partitions", na) == 0 && value(t, reg, "keylane_unowned_partitions", nb) == 0 &&
			value(t, reg, "keylane_namespace_partitions", na) == 2
	})
	if v := value(t, reg, "keylane_oldest_waiting_job_age_seconds", map[string]string{"namespace": "na", "partition": "0"}); v != 0 {
		t.Errorf("oldest waiting job age of an empty partition = %v, want 0", v)
	}
	if s := series(t, reg, "keylane_oldest_waiting_job_timestamp_seconds", na); s != nil {
		t.Errorf("a timestamp of the oldest waiting job with none waiting: %v", s)
	}

	ncA.Close() // the worker of "na" dies: nothing renews its entries
	testwait.Eventually(t, 3*ttl, `"na": no live worker, every partition unowned`, func() bool {
		return value(t, reg, "keylane_namespace_workers", na) == 0 && value(t, reg, "keylane_unowned_partitions", na) == 2
	})
	// The server still holds the dead worker's entries (it drops them a
	// TTL after their last write, a third of the TTL later): the gauges
	// read its heartbeat as lapsed, not the entries as gone.
	jsC, err := jetstream.New(ncC)
	if err != nil {
		t.Fatal(err)
	}
	members, err := jsC.KeyValue(t.Context(), keylane.Names{Namespace: "na"}.Members())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := members.Get(t.Context(), "a1"); err != nil {
		t.Errorf("the dead worker's member entry: %v; want it still there when its namespace is reported dead", err)
	}
	if v := value(t, reg, "keylane_unowned_partitions", nb); v != 0 {
		t.Errorf(`"nb" has %v unowned partitions, want 0`, v)
	}

	c, err := keylane.NewClient(t.Context(), ncC, keylane.ClientConfig{Namespace: "na"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(t.Context(), "k", []byte("waits")); err != nil {
		t.Fatal(err)
	}
	submitted := time.Now()
	p := map[string]string{"namespace": "na", "partition": strconv.Itoa(partition.Of("k", 2))}
	testwait.Eventually(t, 20*time.Second, "the job shows as lag, waiting, in the unowned backlog", func() bool {
		return value(t, reg, "keylane_partition_lag_messages", p) == 1 && value(t, reg, "keylane_oldest_waiting_job_age_seconds", p) > 0.5 &&
			value(t, reg, "keylane_unowned_backlog_jobs", na) == 1
	})
	at := value(t, reg, "keylane_oldest_waiting_job_timestamp_seconds", p)
	if d := time.Duration(at*1e9) - time.Duration(submitted.UnixNano()); d > time.Second || d < -time.Second {
		t.Errorf("oldest waiting job stored at %v, submitted at %v", at, submitted)
	}
}
