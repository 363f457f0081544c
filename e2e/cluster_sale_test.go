package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/partition"
)

// maxElection is nats-server's longest Raft election timeout (4-9s,
// randomised, not configurable): after its leader is killed, a stream,
// bucket or consumer takes up to this long to accept writes again.
const maxElection = 9 * time.Second

// maxClusterStall bounds the longest stall of each key of the sale (a key
// lives on one partition): a Raft election, then the recovery. Beyond
// that, nothing should keep a key waiting.
const maxClusterStall = maxElection + maxRecovery

// maxRecovery bounds how long a key stays stalled once the meta group, the
// jobs stream and every bucket have a leader again (saleRun.recovered).
// Its partition's owner re-synchronises, or, if its lease lapsed during
// the elections, a worker acquires it again; either re-creates the
// partition's consumer, a new R3 Raft group. For about 90s after a
// SIGKILL the server still counts the dead node as online and may prefer
// it as the new group's leader, one time in three; the group then waits
// an election timeout, and the owner gives up after consumerLeaderWait
// (2s) and creates it again. So: a lease TTL, a re-created consumer or
// three, and a second of slack: typically 0-2.5s, 8.8s at worst on a
// loaded CI run (2026-11-22). Before the fix, a request lost in the
// election was waited out for 10s and the partition then handed back
// (5.4-8.2s measured); this bound guards against worse, the summary line
// records the figure.
const maxRecovery = leaseTTL + 9*time.Second

// Phases of every sale: load runs saleWarmup before the fault and
// saleCooldown after the cluster is healthy again, so that a stall the
// fault leaves behind shows within the load.
const (
	saleWarmup   = 3 * time.Second
	saleCooldown = 5 * time.Second
	// nodeDown is how long a killed node stays down before its restart.
	nodeDown = 5 * time.Second
)

// saleScenario is one fault the sale runs through.
type saleScenario struct {
	name string
	// cutoff: the last worker connects through a fault proxy in front
	// of node 0 (saleRun.proxy), the others to every node.
	cutoff bool
	// fault breaks the cluster under load and heals it. It runs on the
	// test goroutine; the driver then waits until the cluster is healthy.
	fault func(ctx context.Context, r *saleRun)
}

// saleScenarios are the faults the cluster issue asks the sale to go
// through; each ends with the history check and the longest stall.
var saleScenarios = []saleScenario{
	{name: "leader-kill", fault: killJobsLeader},
	{name: "nonleader-kill", fault: killNonLeader},
	{name: "rolling-restart", fault: rollingRestart},
	{name: "stream-stepdown", fault: stepDownJobsStream},
	{name: "consumer-stepdown", fault: stepDownConsumers},
	{name: "worker-cutoff", cutoff: true, fault: cutOffWorker},
}

// TestClusterSale runs keylane as users do in production: three worker
// processes on a three-node NATS cluster with every stream, bucket and
// consumer at three replicas. For each of saleScenarios it checks that
// the namespace really is R3, then runs a sale of Calls on a few hot keys
// through the scenario's fault, and checks the history (every
// acknowledged job applied exactly once, per key in stream order, final
// stock = the fold), that no Call hung until its timeout, and that the
// longest stall (the largest gap between consecutive successful Call
// returns) stays within maxClusterStall.
//
// The workers start one after another (startOnCluster): at once, they do
// not start at all (TestClusterConcurrentStart).

func TestClusterSale(t *testing.T) {
	skipUnlessCluster(t)
	for _, sc := range saleScenarios {
		t.Run(sc.name, func(t *testing.T) { runSale(t, sc) })
	}
}

// saleRun is one scenario's sale in progress: what a fault acts on.
type saleRun struct {
	t     *testing.T
	nc    *natscluster.Cluster
	c     *cluster
	proxy *faultproxy.Proxy // the cut-off worker's; nil unless cutoff
	start time.Time         // of the load
	// recovered is when the meta group, the jobs stream and every bucket
	// of the namespace had a leader again after the fault took leaders away (zero: it took
	// none).
	recovered time.Time
}

// logf logs with the time into the load, and the wall clock to match
// against the nodes' and workers' logs.
func (r *saleRun) logf(format string, args ...any) {
	r.t.Helper()
	now := time.Now()
	r.t.Logf("%s (%s): %s", now.Sub(r.start).Round(time.Millisecond), now.UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// runSale is the driver every scenario shares: start the cluster and
// workers, load, fault and heal, stop the load, check the history, and
// log the longest stall.
func runSale(t *testing.T, sc saleScenario) {
	r := &saleRun{t: t}
	var extra func(*natscluster.Cluster, int) []string
	if sc.cutoff {
		extra = func(nc *natscluster.Cluster, i int) []string {
			if i != clusterWorkers-1 {
				return nil
			}
			p, err := faultproxy.New(nc.Node(0).URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			r.proxy = p
			return []string{"--nats", p.URL()}
		}
	}
	r.nc, r.c = startOnClusterWith(t, "e2e-cluster", true, extra)
	c := r.c
	checkR3(t, r.nc, c, 30*time.Second)

	// One line per run with what the issue asks to record, also when
	// the run ends in a Fatal.
	hung, stall, verdict := -1, time.Duration(-1), "not reached"
	defer func() {
		result := "PASS"
		if t.Failed() {
			result = "FAIL"
		}
		t.Logf("summary %s: %s; hung calls %d; longest stall %s; history: %s", sc.name, result, hung, stall.Round(time.Millisecond), verdict)
	}()

	keys := []string{"cluster:0", "cluster:1", "cluster:2"}
	h := newHistory("cluster", func() *keylane.Client { return c.client })
	h.timeout = 30 * time.Second
	for _, k := range keys {
		if o := h.call(k, "set 100000"); o.Err != nil || o.Reply != "ok 100000" {
			t.Fatalf("set %s: %v", k, o)
		}
	}

	r.start = time.Now()
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
				h.call(keys[(i+j)%len(keys)], "buy 1")
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); load.Wait() })
	t.Cleanup(stopLoad)
	r.logf("load started")

	waitFor(t, saleWarmup)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r.logf("consumer leaders before the fault: %s", consumerLeaders(ctx, r.nc, c))
	sc.fault(ctx, r)
	if err := r.nc.WaitHealthy(ctx); err != nil {
		t.Fatalf("cluster not healthy after the fault: %v", err)
	}
	r.logf("cluster healthy; consumer leaders now: %s", consumerLeaders(ctx, r.nc, c))
	waitFor(t, saleCooldown)
	// No new Call starts after this: the stall window ends here, not when
	// the last hung Call gives up.
	end := time.Now()
	stopLoad()
	r.logf("load stopped")

	hung, stall = logCalls(t, h.all(), r.start, end)
	if hung > 0 || stall > maxClusterStall {
		t.Errorf("%d Calls got no reply nor error within their %s timeout (hung), longest stall of a key %s (bound %s)", hung, h.timeout, stall.Round(time.Millisecond), maxClusterStall)
	}
	if !r.recovered.IsZero() {
		for _, k := range keys {
			if d := resumedAfter(h.all(), k, r.recovered); d > maxRecovery {
				t.Errorf("key %s: first success %s after its streams had leaders again (bound %s)", k, d.Round(time.Millisecond), maxRecovery)
			} else {
				r.logf("key %s resumed %s after its streams had leaders again", k, d.Round(time.Millisecond))
			}
		}
	}
	c.requireAlive()
	c.waitBalanced(60 * time.Second)
	final := settle(t, c, h, keys, 90*time.Second)
	// checkCluster, counting the history's violations for the summary.
	c.stopGraceful(15 * time.Second)
	cr := &countingReporter{T: t}
	rep := checkHistory(cr, h.all(), readTraces(t, c.traceFiles()), final, historyRules{})
	t.Logf("history: %s", rep)
	verdict = "ok"
	if cr.errs > 0 {
		verdict = fmt.Sprintf("%d violations", cr.errs)
	}
	verdict += " (" + rep.String() + ")"
}

// countingReporter counts the errors reported through it.
type countingReporter struct {
	*testing.T
	errs int
}

func (r *countingReporter) Errorf(format string, args ...any) {
	r.T.Helper()
	r.errs++
	r.T.Errorf(format, args...)
}

// killJobsLeader SIGKILLs the node that leads the jobs stream, waits for
// another leader, and restarts it after nodeDown.
func killJobsLeader(ctx context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	leader, err := r.nc.StreamLeader(ctx, r.c.names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	r.logf("SIGKILLed %s, the jobs stream leader", leader.Name())
	next, err := r.nc.WaitStreamLeader(ctx, r.c.names.Jobs(), leader)
	if err != nil {
		t.Fatalf("no new jobs stream leader: %v", err)
	}
	r.logf("%s leads the jobs stream", next.Name())
	r.recovered = waitLeaders(ctx, r, leader)
	waitFor(t, nodeDown)
	if err := leader.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	r.logf("restarted %s", leader.Name())
}

// killNonLeader SIGKILLs a node that leads neither the jobs stream nor the
// leases bucket, and restarts it after nodeDown: the leaders stay put, so
// only the followers' loss and catch-up are under test (and whatever
// consumers and clients it led or served).
func killNonLeader(ctx context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	jobs, err := r.nc.StreamLeader(ctx, r.c.names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	leases, err := r.nc.StreamLeader(ctx, "KV_"+r.c.names.Leases())
	if err != nil {
		t.Fatal(err)
	}
	var victim *natscluster.Node
	for _, n := range r.nc.Nodes() {
		if n != jobs && n != leases {
			victim = n
			break
		}
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	r.logf("SIGKILLed %s (jobs stream led by %s, leases by %s)", victim.Name(), jobs.Name(), leases.Name())
	waitFor(t, nodeDown)
	if err := victim.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	r.logf("restarted %s", victim.Name())
}

// rollingRestart stops each node in turn with SIGTERM, restarts it after
// a lease TTL, and waits for the cluster to be healthy before the next, as
// an upgrade does.
func rollingRestart(ctx context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	for _, n := range r.nc.Nodes() {
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		r.logf("stopped %s", n.Name())
		waitFor(t, leaseTTL)
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		r.logf("restarted %s", n.Name())
		if err := r.nc.WaitHealthy(ctx); err != nil {
			t.Fatalf("cluster not healthy after restarting %s: %v", n.Name(), err)
		}
		r.logf("cluster healthy")
	}
}

// stepDownJobsStream makes the jobs stream's leader step down twice, a
// few seconds apart, with every node up.
func stepDownJobsStream(ctx context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	for i := range 2 {
		if i > 0 {
			waitFor(t, saleWarmup)
		}
		next, err := r.nc.StepDownStream(ctx, r.c.names.Jobs())
		if err != nil {
			t.Fatalf("step-down %d of the jobs stream: %v", i+1, err)
		}
		r.logf("jobs stream leader stepped down; %s leads it", next.Name())
	}
}

// stepDownConsumers makes the leaders of two partition consumers step
// down, those of the hot keys' partitions first, a few seconds apart.
func stepDownConsumers(ctx context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	var ps []int
	for _, k := range []string{"cluster:0", "cluster:1", "cluster:2"} {
		if p := partition.Of(k, partitions); !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	for p := 0; len(ps) < 2; p++ {
		if !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	for i, p := range ps[:2] {
		if i > 0 {
			waitFor(t, saleWarmup)
		}
		name := r.c.names.Consumer(p)
		next, err := r.nc.StepDownConsumer(ctx, r.c.names.Jobs(), name)
		if err != nil {
			t.Fatalf("step-down of consumer %s: %v", name, err)
		}
		r.logf("consumer %s leader stepped down; %s leads it", name, next.Name())
	}
}

// cutOffWorker cuts the proxied worker off for two lease TTLs, so its
// leases lapse, then restores it. A Cut alone is no cut-off: it closes the
// worker's connection, and its client reconnects at once to a node it
// learned of from the server's INFO (connect_urls), around the proxy. So
// the proxy first turns into a black hole both ways, as a pulled cable
// does: the connection stays open and silent, and the client notices only
// when its pings go unanswered (two ping intervals). After two lease TTLs
// a Cut drops the silent connection, and Restore lets the worker back.
//
// It logs whether the worker's partitions moved and whether the worker
// put a lease entry during the fault: a put means it was not cut off.
func cutOffWorker(_ context.Context, r *saleRun) {
	t := r.t
	t.Helper()
	id := fmt.Sprintf("%s-w%d", r.c.ns, clusterWorkers-1)
	owned := r.c.ownedBy(id)
	var holes []*faultproxy.Toxic
	for _, dir := range []faultproxy.Direction{faultproxy.Upstream, faultproxy.Downstream} {
		hole, err := r.proxy.Timeout(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		holes = append(holes, hole)
	}
	cutAt := time.Now()
	r.logf("cut %s off (it held partitions %v)", id, owned)
	waitFor(t, 2*leaseTTL)
	r.proxy.Cut()
	if err := r.proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	for _, hole := range holes {
		hole.Remove()
	}
	restoredAt := time.Now()
	r.logf("restored %s's proxy", id)
	taken, _ := r.c.leases.takenOver(owned, id, cutAt)
	puts := 0
	r.c.leases.mu.Lock()
	for _, e := range r.c.leases.events {
		if e.holder == id && e.at.After(cutAt) && e.at.Before(restoredAt) {
			puts++
		}
	}
	r.c.leases.mu.Unlock()
	r.logf("during the cut: %d of %s's %d partitions taken over (%v), %d lease puts by %s", len(taken), id, len(owned), slices.Sorted(maps.Keys(taken)), puts, id)
}

// logCalls logs what the Calls of the load saw: how many succeeded, the
// failures by message, the slowest Call, and the longest stall overall
// and per key (the largest gap between consecutive successful returns,
// from the start of the load to its end).
// It returns how many Calls hung until their timeout, and the longest
// stall of a key.
func logCalls(t *testing.T, ops []histOp, start, end time.Time) (hung int, longest time.Duration) {
	t.Helper()
	var ok []time.Time
	okByKey := map[string][]time.Time{}
	failed, nfailed := map[string]int{}, 0
	var slowest histOp
	for _, o := range ops {
		if o.Invoke.Before(start) {
			continue
		}
		if o.Return.Sub(o.Invoke) > slowest.Return.Sub(slowest.Invoke) {
			slowest = o
		}
		if errors.Is(o.Err, context.DeadlineExceeded) {
			hung++
		}
		if o.Err != nil {
			msg := strings.ReplaceAll(o.Err.Error(), o.ID, "<job>")
			if failed[msg] < 3 {
				t.Logf("  failed: %s", o) // the job IDs to look up in the traces and logs
			}
			failed[msg]++
			nfailed++
			continue
		}
		ok = append(ok, o.Return)
		okByKey[o.Key] = append(okByKey[o.Key], o.Return)
	}
	stall, from := longestGap(ok, start, end)
	t.Logf("calls: %d succeeded, %d failed; longest stall of all keys together %s (from %s into the load, %s); slowest call %s",
		len(ok), nfailed, stall.Round(time.Millisecond), from.Sub(start).Round(time.Millisecond), from.UTC().Format("15:04:05.000"), slowest)
	for _, k := range slices.Sorted(maps.Keys(okByKey)) {
		stall, from := longestGap(okByKey[k], start, end)
		t.Logf("  key %s: %d succeeded, longest stall %s (from %s into the load)", k, len(okByKey[k]), stall.Round(time.Millisecond), from.Sub(start).Round(time.Millisecond))
		longest = max(longest, stall)
	}
	for _, msg := range slices.Sorted(maps.Keys(failed)) {
		t.Logf("  %d calls failed with: %s", failed[msg], msg)
	}
	return hung, longest
}

// longestGap returns the largest gap between consecutive times of ts
// within [start, end], and where it began.
func longestGap(ts []time.Time, start, end time.Time) (time.Duration, time.Time) {
	ts = slices.SortedFunc(slices.Values(ts), func(a, b time.Time) int { return a.Compare(b) })
	prev, from, gap := start, start, time.Duration(0)
	for _, r := range append(ts, end) {
		if d := r.Sub(prev); d > gap {
			gap, from = d, prev
		}
		prev = r
	}
	return gap, from
}

// resumedAfter returns how long after at the first Call of key that
// started after at succeeded (or how long after at the last Call of the
// history returned, if none did).
func resumedAfter(ops []histOp, key string, at time.Time) time.Duration {
	var first, last time.Time
	for _, o := range ops {
		last = latest(last, o.Return)
		if o.Key == key && o.Err == nil && o.Invoke.After(at) && (first.IsZero() || o.Return.Before(first)) {
			first = o.Return
		}
	}
	if first.IsZero() {
		return last.Sub(at)
	}
	return first.Sub(at)
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitLeaders waits until the meta group (which creates and deletes
// consumers), the jobs stream and every bucket of the namespace have a
// leader other than down, and returns when they all had
// one. A group whose leader cannot be learned within the fault's context
// fails the test. Partition consumers are left out: an owner re-creates
// its consumer when it re-synchronises, so their leaders are part of the
// recovery under test.
func waitLeaders(ctx context.Context, r *saleRun, down *natscluster.Node) time.Time {
	t := r.t
	t.Helper()
	if _, err := r.nc.WaitMetaLeader(ctx, down); err != nil {
		t.Fatalf("no meta leader: %v", err)
	}
	streams := []string{r.c.names.Jobs(), "KV_" + r.c.names.Leases(), "KV_" + r.c.names.State(), "KV_" + r.c.names.Results(), "KV_" + r.c.names.Members()}
	for _, s := range streams {
		if _, err := r.nc.WaitStreamLeader(ctx, s, down); err != nil {
			t.Fatalf("stream %s: no leader: %v", s, err)
		}
	}
	at := time.Now()
	r.logf("the meta group, the jobs stream and every bucket have a leader")
	return at
}
