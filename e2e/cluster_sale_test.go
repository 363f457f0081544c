package e2e

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kjs "github.com/keylane/keylane/jetstream"
)

// maxClusterStall bounds the longest stall of the sale: a Raft election
// takes up to 9s (nats-server's maximum election timeout), and a partition
// may then wait out a lease TTL or two; beyond that, nothing should keep
// every Call of a key waiting.
const maxClusterStall = 15 * time.Second

// TestClusterSale runs keylane as users do in production: three worker
// processes on a three-node NATS cluster with every stream, bucket and
// consumer at three replicas. It checks that the namespace really is R3,
// then runs a sale of Calls on a few hot keys while it SIGKILLs the node
// that leads the jobs stream and later restarts it, and checks the
// history (every acknowledged job applied exactly once, per key in stream
// order, final stock = the fold), that no Call hung until its timeout, and
// that the longest stall (the largest gap between consecutive successful
// Call returns) stays within maxClusterStall.
//
// The workers start one after another (startOnCluster): at once, they do
// not start at all (TestClusterConcurrentStart).
//
// KEYLANE_CLUSTER=1 turns it on: it does not pass on today's code yet (see
// the cluster issue: Calls hanging on a lost publish, partitions stalling
// after consumer-leader changes).
func TestClusterSale(t *testing.T) {
	skipUnlessCluster(t)
	nc, c := startOnCluster(t, "e2e-cluster", true)
	checkR3(t, c, 30*time.Second)

	keys := []string{"cluster:0", "cluster:1", "cluster:2"}
	h := newHistory("cluster", func() *kjs.Client { return c.client })
	h.timeout = 30 * time.Second
	for _, k := range keys {
		if o := h.call(k, "set 100000"); o.Err != nil || o.Reply != "ok 100000" {
			t.Fatalf("set %s: %v", k, o)
		}
	}

	start := time.Now()
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
	at := func() string {
		now := time.Now()
		return now.Sub(start).Round(time.Millisecond).String() + " (" + now.UTC().Format("15:04:05.000") + ")"
	}
	t.Logf("load started at %s", start.UTC().Format("15:04:05.000"))

	waitFor(t, 3*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	leader, err := nc.StreamLeader(ctx, c.names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: consumer leaders before the kill: %s", at(), consumerLeaders(ctx, nc, c))
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: SIGKILLed %s, the jobs stream leader", at(), leader.Name())
	next, err := nc.WaitStreamLeader(ctx, c.names.Jobs(), leader)
	if err != nil {
		t.Fatalf("no new jobs stream leader: %v", err)
	}
	t.Logf("%s: %s leads the jobs stream", at(), next.Name())
	waitFor(t, 5*time.Second)
	if err := leader.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: restarted %s", at(), leader.Name())
	if err := nc.WaitHealthy(ctx); err != nil {
		t.Fatalf("cluster not healthy after the restart: %v", err)
	}
	t.Logf("%s: cluster healthy; consumer leaders now: %s", at(), consumerLeaders(ctx, nc, c))
	waitFor(t, 5*time.Second)
	// No new Call starts after this: the stall window ends here, not when
	// the last hung Call gives up.
	end := time.Now()
	stopLoad()
	t.Logf("%s: load stopped", at())

	if hung, stall := logCalls(t, h.all(), start, end); hung > 0 || stall > maxClusterStall {
		t.Errorf("%d Calls got no reply nor error within their %s timeout (hung), longest stall %s (bound %s)", hung, h.timeout, stall.Round(time.Millisecond), maxClusterStall)
	}
	c.requireAlive()
	c.waitBalanced(60 * time.Second)
	final := settle(t, c, h, keys, 90*time.Second)
	checkCluster(t, c, h, final, historyRules{})
}

// logCalls logs what the Calls of the load saw: how many succeeded, the
// failures by message, the slowest Call, and the longest stall overall
// and per key (the largest gap between consecutive successful returns,
// from the start of the load to its end).
// It returns how many Calls hung until their timeout, and the longest
// stall.
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
			failed[strings.ReplaceAll(o.Err.Error(), o.ID, "<job>")]++
			nfailed++
			continue
		}
		ok = append(ok, o.Return)
		okByKey[o.Key] = append(okByKey[o.Key], o.Return)
	}
	stall, from := longestGap(ok, start, end)
	t.Logf("calls: %d succeeded, %d failed; longest stall %s (from %s into the load, %s); slowest call %s",
		len(ok), nfailed, stall.Round(time.Millisecond), from.Sub(start).Round(time.Millisecond), from.UTC().Format("15:04:05.000"), slowest)
	for _, k := range slices.Sorted(maps.Keys(okByKey)) {
		stall, from := longestGap(okByKey[k], start, end)
		t.Logf("  key %s: %d succeeded, longest stall %s (from %s into the load)", k, len(okByKey[k]), stall.Round(time.Millisecond), from.Sub(start).Round(time.Millisecond))
	}
	for _, msg := range slices.Sorted(maps.Keys(failed)) {
		t.Logf("  %d calls failed with: %s", failed[msg], msg)
	}
	return hung, stall
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
