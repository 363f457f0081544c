package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNemesis runs a sale on a few hot keys, through Call and Submit, while
// a nemesis picks faults at random: SIGKILL a worker (and start a new
// one), SIGSTOP one (sometimes past its lease TTL), cut one's connection
// through its fault proxy, or restart the NATS server (same port, same
// store). Then it heals everything, lets the jobs settle and checks the
// history. It has its own server, so restarts touch no other test.
//
// Each run draws a fresh seed and logs it; KEYLANE_SEED replays the
// nemesis's choices (not their exact timing). The faults go on for
// nemesisDefault, or for KEYLANE_NEMESIS (e.g. 5m for a long soak). Every
// step has a deadline, so a hang fails the test with the step's name, the
// workers' process states and a dump of the test process's goroutines;
// with the default duration the whole test is bounded by about 2.5
// minutes.
func TestNemesis(t *testing.T) { nemesis(t, "e2e-nemesis", nemesisDefault) }

// nemesis is TestNemesis in namespace ns, the faults going on for def
// unless KEYLANE_NEMESIS says, its workers started with the extra flags
// args.
func nemesis(t *testing.T, ns string, def time.Duration, args ...string) {
	if testing.Short() {
		t.Skip("nemesis: skipped in -short")
	}
	seed, runFor := nemesisRun(t, "nemesis", "KEYLANE_NEMESIS", def)
	rng := rand.New(rand.NewPCG(seed, seed^0x6e656d65736973))

	srv := startRestartable(t)
	proxies := &proxySet{}
	t.Cleanup(proxies.closeAll) // after the workers have stopped
	c := clusterOn(t, srv.url(), ns, append([]string{"--ack-wait", faultAckWait.String()}, args...)...)
	next := 0
	startOne := func() {
		t.Helper()
		p, err := faultproxy.New(srv.url())
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("%s-w%d", ns, next)
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
	bc := countBatches(t, c)

	keys := []string{"nemesis:0", "nemesis:1", "nemesis:2"}
	h := newHistory("nemesis", func() *keylane.Client { return c.client })
	h.timeout = nemesisOpTimeout
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
				switch noID := c.batches() && (i+j)%3 != 0; {
				case (i+j)%10 == 3 && noID:
					h.submitNoID(key, "restock 5")
				case (i+j)%10 == 3:
					h.submit(key, "restock 5")
				case noID:
					h.callNoID(key, "buy 1")
				default:
					h.call(key, "buy 1")
				}
			}
		}()
	}
	// Each op is bounded by h.timeout, so the load stops within it.
	stopLoad := sync.OnceValue(func() error {
		close(stop)
		return boundedWait(nemesisOpTimeout+5*time.Second, "the load to stop", func() error { load.Wait(); return nil })
	})
	t.Cleanup(func() { _ = stopLoad() })

	// The nemesis: one fault at a time, each healed before the next, a
	// bounded number of them; every step within stepLimit.
	const stepLimit = 30 * time.Second
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
		var what string
		var step func() error
		switch f := rng.IntN(10); {
		case f < 3: // SIGKILL and replace
			counts["kill"]++
			killed = true
			what = fmt.Sprintf("kill %s", w.id)
			step = func() error {
				if err := w.signal(syscall.SIGKILL); err != nil {
					return fmt.Errorf("SIGKILL: %w", err)
				}
				if !w.waitExit(10 * time.Second) {
					return errors.New("did not die of SIGKILL within 10s")
				}
				proxies.close(w.id)
				return nil
			}
		case f < 6: // pause, sometimes past the lease TTL
			counts["pause"]++
			d := []time.Duration{300 * time.Millisecond, time.Second, leaseTTL + time.Second}[rng.IntN(3)]
			what = fmt.Sprintf("pause %s for %s", w.id, d)
			step = func() error {
				if err := w.signal(syscall.SIGSTOP); err != nil {
					return fmt.Errorf("SIGSTOP: %w", err)
				}
				waitFor(t, d)
				if err := w.signal(syscall.SIGCONT); err != nil {
					return fmt.Errorf("SIGCONT: %w", err)
				}
				return nil
			}
		case f < 9: // cut its connection
			counts["cut"]++
			d := []time.Duration{200 * time.Millisecond, time.Second, leaseTTL + time.Second}[rng.IntN(3)]
			what = fmt.Sprintf("cut %s's connection for %s", w.id, d)
			step = func() error {
				p := proxies.get(w.id)
				p.Cut()
				waitFor(t, d)
				return p.Restore()
			}
		default: // restart the server
			counts["restart"]++
			what = "restart the NATS server"
			step = func() error { return srv.restart(20 * time.Second) }
		}
		began := time.Now()
		runStep(t, c, stepLimit, fmt.Sprintf("nemesis %d: %s", n, what), step)
		if strings.HasPrefix(what, "kill ") {
			startOne()
		}
		t.Logf("nemesis %d: %s (%s)", n, what, time.Since(began).Round(time.Millisecond))
	}
	stopping := time.Now()
	if err := stopLoad(); err != nil {
		t.Fatal(err)
	}
	t.Logf("nemesis done: %v; %d ops; the load stopped in %s", counts, len(h.all()), time.Since(stopping).Round(time.Millisecond))

	// Heal: everything is running and connected again; wait for the
	// partitions to settle on the live workers and the stream to drain.
	healing := time.Now()
	c.waitBalanced(25 * time.Second)
	balanced := time.Since(healing)
	final := settle(t, c, h, keys, 30*time.Second)
	t.Logf("healed: balanced after %s, stream drained after %s", balanced.Round(time.Millisecond), time.Since(healing).Round(time.Millisecond))
	c.stopGraceful(15 * time.Second)
	runs := readTraces(t, c.traceFiles())
	rep := checkHistory(t, h.all(), runs, final, historyRules{lossy: killed})
	t.Logf("history: %s", rep)
	bc.check(t, runs)
}

const (
	// nemesisWorkers is how many workers run at once under the nemesis.
	nemesisWorkers = 3
	// nemesisDefault is how long the faults go on when KEYLANE_NEMESIS
	// does not say.
	nemesisDefault = 45 * time.Second
	// nemesisOpTimeout bounds each Call and Submit of the load.
	nemesisOpTimeout = 15 * time.Second
)

// runStep runs one nemesis step and fails the test if it returns an error
// or does not return within limit. A step that hangs is reported, with the
// workers' process states and the test process's goroutines, instead of
// hanging the test.
func runStep(t *testing.T, c *cluster, limit time.Duration, what string, step func() error) {
	t.Helper()
	err := boundedWait(limit, what, step)
	if err == nil {
		return
	}
	if errors.Is(err, errStepTimeout) {
		t.Logf("worker processes: %s", c.procStates())
		t.Logf("goroutines of the test process:\n%s", goroutines())
	}
	t.Fatalf("%s: %v", what, err)
}

var errStepTimeout = errors.New("did not finish in time")

// nemesisRun returns a randomized test's seed (KEYLANE_SEED, or a fresh
// one) and how long its faults go on (the duration in env, or def), and
// logs both so that a failure can be replayed.
func nemesisRun(t *testing.T, what, env string, def time.Duration) (uint64, time.Duration) {
	t.Helper()
	runFor := def
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", env, v, err)
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
	t.Logf("%s seed %d for %s (KEYLANE_SEED=%d %s=%s to replay)", what, seed, runFor, seed, env, runFor)
	return seed, runFor
}

// boundedWait runs f on its own goroutine and waits up to limit for it.
// After a timeout f is left running: the test fails and its Cleanup ends
// the processes f waits on.
func boundedWait(limit time.Duration, what string, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("%s: %w within %s", what, errStepTimeout, limit)
	}
}

// goroutines returns the stacks of every goroutine of the test process.
func goroutines() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}

// procStates reports each live worker's process state from /proc ("T" is
// stopped, "D" is in an uninterruptible wait).
func (c *cluster) procStates() string {
	var parts []string
	for _, w := range c.liveWorkers() {
		state := "?"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.cmd.Process.Pid)); err == nil {
			// pid (comm) state ...: comm may hold spaces, so cut after ')'.
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
				state = string(b[i+2])
			}
		}
		parts = append(parts, fmt.Sprintf("%s pid %d state %s", w.id, w.cmd.Process.Pid, state))
	}
	return strings.Join(parts, "; ")
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
		err := boundedWait(20*time.Second, "shut the NATS server down", func() error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.s != nil {
				r.s.Shutdown()
				r.s.WaitForShutdown()
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	return r
}

func (r *restartable) url() string { return "nats://127.0.0.1:" + strconv.Itoa(r.port) }

// restart shuts the server down and starts it again on its port and store,
// trying for up to limit: the port can stay taken for a moment (a client
// reconnecting to the empty port may get it as its own source port and
// connect to itself until its connect timeout).
func (r *restartable) restart(limit time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.s.Shutdown()
	r.s.WaitForShutdown()
	r.s = nil
	deadline := time.Now().Add(limit)
	for {
		s, err := embedded.Start(embedded.Config{Port: r.port, StoreDir: r.dir, ServerName: "keylane-nemesis", ReadyTimeout: 5 * time.Second})
		if err == nil {
			r.s = s
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("restart the NATS server on port %d: %w", r.port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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

// clusterOn connects to the server at url and wipes namespace ns, with no
// workers yet: the caller starts them (startCluster on the shared server,
// startWorkerWith here), then opens the client, watches the leases and
// waits for balance.
func clusterOn(t *testing.T, url, ns string, args ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, ns: ns, names: keylane.Names{Namespace: ns}, dir: t.TempDir(), args: args}
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
