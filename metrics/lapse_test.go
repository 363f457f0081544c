package metrics

import (
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// keylane_partitions_owned counts the partitions whose lease the worker
// can still prove it holds: in a NATS outage it drops to 0 once the
// leases' trust deadline passed without a renew, not when the owners'
// goroutines finally wind down (which waits on the server that is gone),
// and its per-partition series go with it.
func TestPartitionsOwnedDropsWhenTheLeaseLapsesInAnOutage(t *testing.T) {
	dir, port := t.TempDir(), testwait.FreePort(t)
	srv := natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	nc := natstest.Connect(t, srv, nats.ReconnectWait(50*time.Millisecond))
	ttl := 3 * time.Second
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		ID: "o1", Topology: keylane.TopologyConfig{Namespace: "mo", Partitions: 4, LeaseTTL: ttl}, Handler: echo,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(t.Context()) })
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(w))
	wl := map[string]string{"worker": "o1"}
	testwait.Eventually(t, 20*time.Second, "4 partitions owned", func() bool { return value(t, reg, "keylane_partitions_owned", wl) == 4 })

	srv.Shutdown()
	srv.WaitForShutdown()
	outage := time.Now()
	// The trust window is TTL - SafetyMargin from the last renew's send:
	// at most one TTL after the outage began (plus a second for the
	// scrape). Before, it waited for the owners to give their leases back,
	// a request bounded by another TTL that no server answers.
	testwait.Eventually(t, 2*ttl+5*time.Second, "keylane_partitions_owned 0 once the leases are no longer trusted", func() bool {
		return value(t, reg, "keylane_partitions_owned", wl) == 0 && len(families(t, reg)["keylane_lease_trusted_for_seconds"].GetMetric()) == 0
	})
	t.Logf("dropped after %s", time.Since(outage))
	if took := time.Since(outage); took > ttl+time.Second {
		t.Errorf("keylane_partitions_owned dropped %s after the outage began, want within the lease TTL (%s) and a scrape", took, ttl)
	}
	if w.Stats().Owned != 0 {
		t.Errorf("Stats().Owned = %d with every lease lapsed, want 0", w.Stats().Owned)
	}
}
