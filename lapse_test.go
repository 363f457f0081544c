package keylane

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// proxiedWorker starts a worker whose connection goes through a fault
// proxy; it is stopped when the test ends.
func (e *env) proxiedWorker(id string, h Handler) (*Worker, *faultproxy.Proxy) {
	e.t.Helper()
	nc, p := proxiedConn(e.t, e.srv.ClientURL())
	return startWorker(e.t, nc, WorkerConfig{Topology: e.topo.Config, Handler: h, ID: id, AckWait: 5 * time.Second,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond }}), p
}

// TestLapsedLeaseIsTakenAgain: the only worker's renews fail for about
// two TTLs (its connection cut, swallowed or slowed), so its lease lapses
// without another worker taking it. Once the connection works again the
// worker must own the partition again and run queued jobs within a few
// TTLs.
func TestLapsedLeaseIsTakenAgain(t *testing.T) {
	const ttl = time.Second
	faults := []struct {
		name  string
		fault func(t *testing.T, p *faultproxy.Proxy) (restore func())
	}{
		{"cut", func(t *testing.T, p *faultproxy.Proxy) func() {
			p.Cut()
			return func() {
				if err := p.Restore(); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"swallow-upstream", func(t *testing.T, p *faultproxy.Proxy) func() {
			x, err := p.Timeout(faultproxy.Upstream, 0)
			if err != nil {
				t.Fatal(err)
			}
			return x.Remove
		}},
		{"slow-downstream", func(t *testing.T, p *faultproxy.Proxy) func() {
			x, err := p.Latency(faultproxy.Downstream, 3*ttl, 0)
			if err != nil {
				t.Fatal(err)
			}
			return x.Remove
		}},
		{"slow-upstream", func(t *testing.T, p *faultproxy.Proxy) func() {
			x, err := p.Latency(faultproxy.Upstream, 3*ttl, 0)
			if err != nil {
				t.Fatal(err)
			}
			return x.Remove
		}},
	}
	for _, f := range faults {
		for _, busy := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/busy=%v", f.name, busy), func(t *testing.T) {
				e := newEnv(t, TopologyConfig{Partitions: 1, LeaseTTL: ttl})
				var mu sync.Mutex
				ran := map[string]bool{}
				release, started := make(chan struct{}), make(chan struct{}, 1)
				h := HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
					if j.Key == "block" {
						select {
						case started <- struct{}{}:
						default:
						}
						select {
						case <-release:
						case <-ctx.Done():
							return nil, ctx.Err()
						}
					}
					mu.Lock()
					ran[j.ID] = true
					mu.Unlock()
					return nil, nil
				})
				w, p := e.proxiedWorker("w", h)
				e.waitOwned(w)
				if busy {
					if _, err := e.client.Submit(ctx(t), "block", nil); err != nil {
						t.Fatal(err)
					}
					select {
					case <-started:
					case <-time.After(10 * time.Second):
						t.Fatal("the blocking job did not start")
					}
				}
				before := w.Stats()
				restore := f.fault(t, p)
				testwait.Eventually(t, 10*time.Second, "the lease lapsed", func() bool { return len(w.Owned()) == 0 })
				// Another TTL of failing renews, then the network heals.
				time.Sleep(ttl)
				restore()
				close(release)
				var ids []string
				for i := range 8 {
					id := fmt.Sprintf("j%d", i)
					ids = append(ids, id)
					if _, err := e.client.Submit(ctx(t), fmt.Sprintf("k%d", i), nil, WithID(id)); err != nil {
						t.Fatal(err)
					}
				}
				if !within(15*ttl, func() bool {
					mu.Lock()
					defer mu.Unlock()
					for _, id := range ids {
						if !ran[id] {
							return false
						}
					}
					return true
				}) {
					t.Fatalf("jobs not run %s after the network healed: owned %v, stats before %+v, now %+v", 15*ttl, w.Owned(), before, w.Stats())
				}
				t.Logf("stats %+v", w.Stats())
			})
		}
	}
}

// TestOwnerCreatesItsConsumerThroughASlowMetaLeader: three nodes, R3,
// the only worker on node 2 (through a fault proxy), the buckets and the
// jobs stream led by node 1, the meta leader on node 0, and what node 0
// sends node 2 held 3s behind (the shape of
// TestNoJobRunsTwiceWithALaggingFollower, whose old worker stalled so
// with 8s). The worker's connection is cut until its lease lapses; it
// takes the partition again (a lease TTL of 6s leaves room for a slow
// answer) and must create the partition's consumer again, a meta request
// that now takes over 3s. A bound on each attempt below what the request
// takes fails every attempt for as long as the lag lasts.
func TestOwnerCreatesItsConsumerThroughASlowMetaLeader(t *testing.T) {
	const ttl = 6 * time.Second
	c := natscluster.Start(t, natscluster.Options{ProxiedLinks: [][2]int{{0, 2}}})
	nc1, err := nats.Connect(c.Node(1).URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc1.Close)
	js1, err := jetstream.New(nc1)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), js1, TopologyConfig{Namespace: "slowmeta", Partitions: 1, Replicas: 3, LeaseTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	jobsStream := topo.StreamOf(0).CachedInfo().Config.Name
	placeLeaders := func() {
		t.Helper()
		for range 5 {
			mctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
			l, err := c.WaitMetaLeader(mctx, nil)
			if err == nil && l != c.Node(0) {
				_, err = c.StepDownMeta(mctx)
			}
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if l == c.Node(0) {
				break
			}
		}
		for _, s := range []string{jobsStream, "KV_" + topo.Names.Leases(), "KV_" + topo.Names.Members()} {
			mctx, cancel := context.WithTimeout(ctx(t), time.Minute)
			err := c.MoveStreamLeader(mctx, s, c.Node(1))
			cancel()
			if err != nil {
				t.Fatalf("move the leader of %s: %v", s, err)
			}
		}
	}
	placeLeaders()

	var mu sync.Mutex
	ran := map[string]bool{}
	h := HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		ran[j.ID] = true
		mu.Unlock()
		return nil, nil
	})
	nc2, p := proxiedConn(t, c.Node(2).URL(), nats.IgnoreDiscoveredServers())
	w := startWorker(t, nc2, WorkerConfig{Topology: topo.Config, Handler: h, ID: "w", Concurrency: 8, Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	testwait.Eventually(t, 30*time.Second, "the worker owns partition 0", func() bool { return len(w.Owned()) == 1 })

	remove, err := c.Link(0, 2).Delay(0, 2, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	// The delay's gap may have moved leaders: put them back.
	placeLeaders()
	// The lapse.
	p.Cut()
	testwait.Eventually(t, 20*time.Second, "the lease lapsed", func() bool { return len(w.Owned()) == 0 })
	testwait.Eventually(t, 20*time.Second, "the link cut", func() bool { return !nc2.IsConnected() })
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}

	cl, err := NewClient(ctx(t), nc1, ClientConfig{Namespace: "slowmeta"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	var ids []string
	for i := range 8 {
		id := fmt.Sprintf("j%d", i)
		ids = append(ids, id)
		if _, err := cl.Submit(ctx(t), fmt.Sprintf("k%d", i), nil, WithID(id)); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 60 * time.Second
	if !within(limit, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if !ran[id] {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("jobs not run within %s: owned %v, stats %+v", limit, w.Owned(), w.Stats())
	}
}
