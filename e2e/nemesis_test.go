package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/faultproxy"
	kjs "github.com/keylane/keylane/jetstream"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// nemesisWorkers is how many workers run at once under the nemesis.
const nemesisWorkers = 3

// TestNemesis runs a sale on a few hot keys, through Call and Submit, while
// a nemesis picks faults at random: SIGKILL a worker (and start a new
// one), SIGSTOP one (sometimes past its lease TTL), cut one's connection
// through its fault proxy, or restart the NATS server (same port, same
// store). Then it heals everything, lets the jobs settle and checks the
// history. It has its own server, so restarts touch no other test.
//
// KEYLANE_NEMESIS sets how long the faults go on (e.g. 60s) and turns the
// test on: it is not yet part of the default run, because not every seed
// passes yet (see the faults issue's closing note);
// KEYLANE_SEED replays the nemesis's choices (not their exact timing).
func TestNemesis(t *testing.T) {
	if testing.Short() {
		t.Skip("nemesis: skipped in -short")
	}
	if os.Getenv("KEYLANE_NEMESIS") == "" {
		t.Skip("nemesis: set KEYLANE_NEMESIS=60s to run it (not yet in the default run)")
	}
	runFor := 60 * time.Second
	if v := os.Getenv("KEYLANE_NEMESIS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KEYLANE_NEMESIS=%q: %v", v, err)
		}
		runFor = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("KEYLANE_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("KEYLANE_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("nemesis seed %d (KEYLANE_SEED=%d to replay)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x6e656d65736973))

	srv := startRestartable(t)
	proxies := &proxySet{}
	t.Cleanup(proxies.closeAll) // after the workers have stopped
	c := clusterOn(t, srv.url(), "e2e-nemesis", "--ack-wait", faultAckWait.String())
	next := 0
	startOne := func() {
		t.Helper()
		p, err := faultproxy.New(srv.url())
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("e2e-nemesis-w%d", next)
		next++
		proxies.add(id, p)
		c.startWorkerWith(id, "--nats", p.URL())
	}
	for range nemesisWorkers {
		startOne()
	}
	c.client = c.openClient()
	t.Cleanup(c.client.Close)
	c.leases = watchLeases(t, c.js, c.names)
	c.waitBalanced(30 * time.Second)

	keys := []string{"nemesis:0", "nemesis:1", "nemesis:2"}
	h := newHistory("nemesis", func() *kjs.Client { return c.client })
	h.timeout = 20 * time.Second
	for _, k := range keys {
		if o := h.call(k, "set 1000"); o.Err != nil || o.Reply != "ok 1000" {
			t.Fatalf("set %s: %v", k, o)
		}
	}

	stop := make(chan struct{})
	var load sync.WaitGroup
	for i := range 12 {
		load.Add(1)
		go func() {
			defer load.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[(i+j)%len(keys)]
				if (i+j)%10 == 3 {
					h.submit(key, "restock 5")
				} else {
					h.call(key, "buy 1")
				}
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); load.Wait() })
	t.Cleanup(stopLoad)

	// The nemesis: one fault at a time, each healed before the next, a
	// bounded number of them.
	var killed bool
	end := time.Now().Add(runFor)
	counts := map[string]int{}
	for n := 0; n < 500 && time.Now().Before(end); n++ {
		waitFor(t, time.Duration(300+rng.IntN(1200))*time.Millisecond)
		live := c.liveWorkers()
		if len(live) == 0 {
			t.Fatal("no worker alive")
		}
		w := live[rng.IntN(len(live))]
		switch f := rng.IntN(10); {
		case f < 3: // SIGKILL and replace
			counts["kill"]++
			killed = true
			if err := w.signal(syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL %s: %v", w.id, err)
			}
			if !w.waitExit(10 * time.Second) {
				t.Fatalf("%s did not die of SIGKILL", w.id)
			}
			proxies.close(w.id)
			startOne()
			t.Logf("nemesis %d: killed %s, started a new worker", n, w.id)
		case f < 6: // pause, sometimes past the lease TTL
			counts["pause"]++
			d := []time.Duration{300 * time.Millisecond, time.Second, leaseTTL + time.Second}[rng.IntN(3)]
			if err := w.signal(syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP %s: %v", w.id, err)
			}
			waitFor(t, d)
			if err := w.signal(syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT %s: %v", w.id, err)
			}
			t.Logf("nemesis %d: paused %s for %s", n, w.id, d)
		case f < 9: // cut its connection
			counts["cut"]++
			d := []time.Duration{200 * time.Millisecond, time.Second, leaseTTL + time.Second}[rng.IntN(3)]
			p := proxies.get(w.id)
			p.Cut()
			waitFor(t, d)
			if err := p.Restore(); err != nil {
				t.Fatal(err)
			}
			t.Logf("nemesis %d: cut %s's connection for %s", n, w.id, d)
		default: // restart the server
			counts["restart"]++
			srv.restart(t)
			t.Logf("nemesis %d: restarted the NATS server", n)
		}
	}
	stopLoad()
	t.Logf("nemesis done: %v; %d ops", counts, len(h.all()))

	// Heal: everything is running and connected again; wait for the
	// partitions to settle on the live workers and the stream to drain.
	c.waitBalanced(60 * time.Second)
	final := settle(t, c, h, keys, 90*time.Second)
	c.stopGraceful(20 * time.Second)
	rep := checkHistory(t, h.all(), readTraces(t, c.traceFiles()), final, historyRules{lossy: killed})
	t.Logf("history: %s", rep)
}

// restartable is an in-process NATS server that can be restarted on the
// same port with the same store.
type restartable struct {
	mu   sync.Mutex
	s    *server.Server
	port int
	dir  string
}

func startRestartable(t *testing.T) *restartable {
	t.Helper()
	r := &restartable{dir: filepath.Join(t.TempDir(), "jetstream")}
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: r.dir, ServerName: "keylane-nemesis"})
	if err != nil {
		t.Fatal(err)
	}
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		s.Shutdown()
		t.Fatalf("NATS server address %v", s.Addr())
	}
	r.s, r.port = s, addr.Port
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.s.Shutdown()
		r.s.WaitForShutdown()
	})
	return r
}

func (r *restartable) url() string { return "nats://127.0.0.1:" + strconv.Itoa(r.port) }

// restart shuts the server down and starts it again on its port and store.
func (r *restartable) restart(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.s.Shutdown()
	r.s.WaitForShutdown()
	var err error
	for range 50 { // the port may linger for a moment
		var s *server.Server
		s, err = embedded.Start(embedded.Config{Port: r.port, StoreDir: r.dir, ServerName: "keylane-nemesis"})
		if err == nil {
			r.s = s
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("restart the NATS server on port %d: %v", r.port, err)
}

// proxySet holds each worker's fault proxy.
type proxySet struct {
	mu sync.Mutex
	m  map[string]*faultproxy.Proxy
}

func (ps *proxySet) add(id string, p *faultproxy.Proxy) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = map[string]*faultproxy.Proxy{}
	}
	ps.m[id] = p
}

func (ps *proxySet) get(id string) *faultproxy.Proxy {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.m[id]
}

func (ps *proxySet) close(id string) {
	ps.mu.Lock()
	p := ps.m[id]
	delete(ps.m, id)
	ps.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

func (ps *proxySet) closeAll() {
	ps.mu.Lock()
	ids := slices.Collect(mapKeys(ps.m))
	ps.mu.Unlock()
	for _, id := range ids {
		ps.close(id)
	}
}

// clusterOn is startCluster on another server and with no workers yet:
// the caller starts them (startWorkerWith), then opens the client, watches
// the leases and waits for balance.
func clusterOn(t *testing.T, url, ns string, args ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, ns: ns, names: kjs.Names{Namespace: ns}, dir: t.TempDir(), args: args}
	nc, err := nats.Connect(url, nats.Name("e2e-"+ns), nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	c.wipe()
	// Registered after nc.Close, so it runs before it: processes first.
	t.Cleanup(c.stopAll)
	return c
}

// startWorkerWith starts a worker with extra flags after the cluster's
// (a later flag wins: "--nats" through a proxy).
func (c *cluster) startWorkerWith(id string, extra ...string) *workerProc {
	c.t.Helper()
	saved := c.args
	c.args = append(slices.Clone(saved), extra...)
	defer func() { c.args = saved }()
	return c.startWorker(id)
}

// liveWorkers returns the worker processes that have not exited.
func (c *cluster) liveWorkers() []*workerProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws []*workerProc
	for _, w := range c.workers {
		if !w.exited() {
			ws = append(ws, w)
		}
	}
	return ws
}
