package metrics

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// keylane_dead_letters follows the dead-letter stream: 0, 1 once a job
// fails for good, 0 again once an operator purged it.
func TestDeadLettersGauge(t *testing.T) {
	d := start(t, keylane.WorkerConfig{
		ID:       "d1",
		Topology: keylane.TopologyConfig{Namespace: "md", Partitions: 1, LeaseTTL: time.Second},
		Handler:  echo,
	}, nil)
	ns := map[string]string{"namespace": "md"}
	if v := value(t, d.reg, "keylane_dead_letters", ns); v != 0 {
		t.Fatalf("keylane_dead_letters = %v before any job, want 0", v)
	}
	if _, err := d.c.Call(t.Context(), "k", []byte("fail")); err == nil {
		t.Fatal("a failing job succeeded")
	}
	testwait.Eventually(t, 10*time.Second, "keylane_dead_letters 1", func() bool { return value(t, d.reg, "keylane_dead_letters", ns) == 1 })
	js, err := jetstream.New(d.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keylane.PurgeDeadLetters(t.Context(), js, "md"); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "keylane_dead_letters 0 after the purge", func() bool { return value(t, d.reg, "keylane_dead_letters", ns) == 0 })
}

// A partition without an owner and the jobs stored in it show: before
// any worker ran (no consumer yet), while a worker owns every partition
// (none), and after it stopped with jobs submitted since (its consumer's
// pending count).
func TestUnownedPartitionsAndTheirBacklog(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx := t.Context()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo := keylane.TopologyConfig{Namespace: "mu", Partitions: 2, LeaseTTL: time.Second}
	if _, err := keylane.Setup(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "mu"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reg := prometheus.NewRegistry()
	n := NewNamespace(js, "mu")
	n.every = 0
	reg.MustRegister(n)
	ns := map[string]string{"namespace": "mu"}
	submit := func(jobs int, prefix string) {
		t.Helper()
		for i := range jobs {
			if _, err := c.Submit(ctx, fmt.Sprintf("%s%d", prefix, i), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	unowned := func(parts, jobs float64) func() bool {
		return func() bool {
			return value(t, reg, "keylane_unowned_partitions", ns) == parts && value(t, reg, "keylane_unowned_backlog_jobs", ns) == jobs
		}
	}

	submit(5, "a")
	testwait.Eventually(t, 10*time.Second, "2 unowned partitions holding 5 jobs (no worker yet)", unowned(2, 5))

	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{ID: "u1", Topology: topo, Handler: echo})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "every partition owned, nothing unowned", func() bool {
		return w.Stats().Succeeded == 5 && unowned(0, 0)()
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "2 unowned partitions once the worker stopped", unowned(2, 0))
	submit(4, "b")
	testwait.Eventually(t, 10*time.Second, "2 unowned partitions holding 4 jobs (their consumers' pending)", unowned(2, 4))
}

// keylane_nats_connected goes to 0 while the server is away and back to
// 1 when it returns; the namespace's series leave the scrape meanwhile,
// and the scrape itself never fails.
func TestNATSConnectedGauge(t *testing.T) {
	dir, port := t.TempDir(), testwait.FreePort(t)
	srv := natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	nc := natstest.Connect(t, srv, nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keylane.Setup(t.Context(), js, keylane.TopologyConfig{Namespace: "mc", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	n := NewNamespace(js, "mc")
	n.every = 0
	reg.MustRegister(Connected(nc, "c1"), n)
	w := map[string]string{"worker": "c1"}
	ns := map[string]string{"namespace": "mc"}
	if v := value(t, reg, "keylane_nats_connected", w); v != 1 {
		t.Fatalf("keylane_nats_connected = %v while connected, want 1", v)
	}
	if v := value(t, reg, "keylane_unowned_partitions", ns); v != 1 {
		t.Fatalf("keylane_unowned_partitions = %v, want 1", v)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	testwait.Eventually(t, 20*time.Second, "keylane_nats_connected 0 with the server gone", func() bool {
		return value(t, reg, "keylane_nats_connected", w) == 0
	})
	if v := value(t, reg, "keylane_unowned_partitions", ns); !math.IsNaN(v) {
		t.Errorf("keylane_unowned_partitions = %v with the server gone, want no series", v)
	}
	natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	testwait.Eventually(t, 20*time.Second, "keylane_nats_connected 1 and the namespace read again once the server is back", func() bool {
		return value(t, reg, "keylane_nats_connected", w) == 1 && value(t, reg, "keylane_unowned_partitions", ns) == 1
	})
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(BuildInfo())
	m := series(t, reg, "keylane_build_info", map[string]string{"goversion": runtime.Version()})
	if m == nil || m.GetGauge().GetValue() != 1 {
		t.Fatalf("keylane_build_info{goversion=%q} = %v, want 1", runtime.Version(), m)
	}
	for _, l := range []string{"version", "revision"} {
		found := false
		for _, lp := range m.GetLabel() {
			found = found || lp.GetName() == l
		}
		if !found {
			t.Errorf("keylane_build_info has no %s label", l)
		}
	}
}
