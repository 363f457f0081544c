package e2e

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/partition"
)

const (
	loadSKUs   = 10
	loadStock  = 100000 // never sells out: every purchase is a state write
	loadBuyers = 32
)

// startLoad stocks loadSKUs SKUs and starts buyers that purchase
// continuously, spread evenly over the SKUs, until stopped.
func startLoad(t *testing.T, c *cluster, prefix string) (*buyers, []string, []int64) {
	t.Helper()
	skus := skuNames("sku", loadSKUs)
	initial := make([]int64, loadSKUs)
	for i := range initial {
		initial[i] = loadStock
	}
	c.setStock(skus, initial)
	b := c.startBuyers(loadBuyers, skus, prefix, 1<<30, func(i int) int { return (i * 7) % loadSKUs })
	return b, skus, initial
}

// victimOf returns the worker whose partitions carry the most of the
// load's SKUs, and its partitions: a fault there hits jobs in flight.
func victimOf(t *testing.T, c *cluster, skus []string) (*workerProc, []int) {
	t.Helper()
	var victim *workerProc
	var parts []int
	best := 0
	for i := range 3 {
		w := c.worker(i)
		ps := c.ownedBy(w.id)
		n := 0
		for _, s := range skus {
			if slices.Contains(ps, partition.Of(s, partitions)) {
				n++
			}
		}
		if n > best {
			victim, parts, best = w, ps, n
		}
	}
	if victim == nil {
		t.Fatal("no worker owns a partition with load on it")
	}
	t.Logf("victim %s owns partitions %v with %d of the %d SKUs", victim.id, parts, best, len(skus))
	return victim, parts
}

// logSlowest logs the slowest purchase: one that waited out the fault.
func logSlowest(t *testing.T, ps []purchase) {
	t.Helper()
	var slow purchase
	for _, p := range ps {
		if p.end.Sub(p.start) > slow.end.Sub(slow.start) {
			slow = p
		}
	}
	t.Logf("slowest purchase %s took %s (%q)", slow.id, slow.end.Sub(slow.start).Round(time.Millisecond), slow.reply)
}

// finishLoad stops the buyers and checks replies and stock arithmetic.
func finishLoad(t *testing.T, c *cluster, b *buyers, skus []string, initial []int64) []purchase {
	t.Helper()
	ps := b.stop()
	demand, sold := checkPurchases(t, ps, len(skus))
	checkStock(t, c, skus, initial, demand, sold)
	return ps
}

// TestKillWorker kills a worker with SIGKILL while purchases are in flight.
// Its partitions must move to the survivors within the lease TTL plus one
// renewal period (DESIGN promise 5), no purchase may be lost, and none may
// take effect twice.
func TestKillWorker(t *testing.T) { killWorker(t, "e2e-kill") }

// killWorker is TestKillWorker in namespace ns, its workers started with
// the extra flags args.
func killWorker(t *testing.T, ns string, args ...string) {
	c := startCluster(t, ns, 3, args...)
	bc := countBatches(t, c)
	b, skus, initial := startLoad(t, c, "kill")
	b.waitCompleted(t, 500, 60*time.Second)

	victim, parts := victimOf(t, c, skus)
	before := b.completed()
	killed := time.Now()
	if err := victim.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !victim.waitExit(5 * time.Second) {
		t.Fatal("killed worker did not exit")
	}
	last := c.waitTakenOver(parts, victim.id, killed, 30*time.Second)
	failover := last.Sub(killed)
	// The victim's lease and member entries were last renewed no earlier
	// than TTL/3 before the kill and expire TTL after that; DESIGN promises
	// TTL plus one renewal period. One second on top covers the server's
	// expiry timer, the watch delivery and acquiring on a loaded 2-core
	// machine with the race-instrumented server in this process.
	bound := leaseTTL + leaseTTL/3 + time.Second
	t.Logf("failover: partitions %v of %s taken over %s after SIGKILL (bound %s); %d purchases done before the kill",
		parts, victim.id, failover.Round(time.Millisecond), bound, before)
	if failover > bound {
		t.Errorf("failover took %s, more than %s", failover, bound)
	}
	c.waitBalanced(10 * time.Second)

	// Purchases keep flowing after the failover.
	b.waitCompleted(t, b.completed()+500, 60*time.Second)
	ps := finishLoad(t, c, b, skus, initial)
	logSlowest(t, ps)
	c.stopGraceful(15 * time.Second)
	runs := readTraces(t, c.traceFiles())
	rep := checkTrace(t, runs, ps, traceRules{mayLoseApplied: true})
	t.Logf("%d purchases; trace: %d runs of %d jobs, %d jobs ran more than once (redelivered), %d with their applied run lost in the kill, max concurrent runs per key %d",
		len(ps), rep.runs, rep.jobs, rep.reruns, rep.lostApplied, rep.maxConcurrent)
	bc.check(t, runs)
}

// TestPausedWorker stops a worker with SIGSTOP in the middle of its jobs
// (each holds 20ms inside the critical section) for more than twice the
// lease TTL while purchases go on, then resumes it. The survivors take its
// partitions; the resumed worker must step down and none of its late writes
// may take effect over a newer owner's.
func TestPausedWorker(t *testing.T) { pausedWorker(t, "e2e-pause") }

// pausedWorker is TestPausedWorker in namespace ns, its workers started
// with the extra flags args.
func pausedWorker(t *testing.T, ns string, args ...string) {
	if testing.Short() {
		t.Skip("pauses a worker for more than 2×TTL")
	}
	c := startCluster(t, ns, 3, append([]string{"--hold", "20ms"}, args...)...)
	bc := countBatches(t, c)
	b, skus, initial := startLoad(t, c, "pause")
	b.waitCompleted(t, 200, 60*time.Second)

	victim, parts := victimOf(t, c, skus)
	paused := time.Now()
	if err := victim.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	last := c.waitTakenOver(parts, victim.id, paused, 30*time.Second)
	t.Logf("partitions %v of paused %s taken over %s after SIGSTOP", parts, victim.id, last.Sub(paused).Round(time.Millisecond))
	// Purchases go on without the paused worker.
	b.waitCompleted(t, b.completed()+100, 30*time.Second)
	// Keep it stopped past 2×TTL: a deliberate pause, not a wait for a
	// condition.
	if d := 2*leaseTTL + 500*time.Millisecond - time.Since(paused); d > 0 {
		time.Sleep(d)
	}
	resumed := time.Now()
	if err := victim.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGCONT after %s", resumed.Sub(paused).Round(time.Millisecond))

	// It comes back as a member and gets its share again.
	c.waitBalanced(30 * time.Second)
	b.waitCompleted(t, b.completed()+200, 60*time.Second)
	c.requireAlive()
	ps := finishLoad(t, c, b, skus, initial)
	logSlowest(t, ps)
	c.stopGraceful(15 * time.Second)

	runs := readTraces(t, c.traceFiles())
	// The victim's runs that spanned the pause ran beside the successor's
	// by design (leases did not behave); the rest must still be one at a
	// time.
	spansPause := func(r sale.Span) bool {
		return r.Worker == victim.id && r.Start < resumed.Add(leaseTTL).UnixNano() && r.End > paused.UnixNano()
	}
	// While the resumed victim has not yet noticed its lease is gone, it and
	// its successor both write: a write that loses the compare-and-set to
	// the other's tells its tracer "not applied" although the other's write
	// of the same job (held, answered from it) landed. Purchases whose runs
	// in that window all say "not applied" are presumed applied, and the
	// stock check (finishLoad) holds the presumption to account; outside
	// the window the check stays strict.
	// A run's write follows its end (group commit): what counts is when
	// the write's outcome was known, Settled. A run that ended just before
	// SIGSTOP, its write in flight through the pause, is in the window (a
	// run ended 4ms before the pause, its write landed, the successor
	// answered the job from it: 2026-11-22).
	inPauseWindow := func(r sale.Span) bool {
		return r.Start < resumed.Add(leaseTTL).UnixNano() && max(r.End, r.Settled) > paused.UnixNano()
	}
	rep := checkTrace(t, runs, ps, traceRules{ignoreOverlap: spansPause, unknownWrite: inPauseWindow})
	t.Logf("%d purchases; trace: %d runs of %d jobs, %d redelivered", len(ps), rep.runs, rep.jobs, rep.reruns)
	bc.check(t, runs)
	if testing.Verbose() {
		t.Logf("log of the resumed worker:\n%s", tail(victim.stderr, 60))
	}

	var late, lateApplied int
	for _, r := range runs {
		if r.Worker == victim.id && r.Start < paused.UnixNano() && r.End > resumed.UnixNano() {
			late++
			if r.Applied {
				lateApplied++
			}
		}
	}
	st := readStats(t, victim)
	t.Logf("resumed worker %s: %d runs spanned the pause, %d of them wrote (no newer owner had written the key yet); stats %+v", victim.id, late, lateApplied, st)
	// Stepping down shows as Lost, or in the log. A resumed owner whose
	// fetch loop notices its consumer was re-created by the successor
	// before its own lease watchdog notices the expiry steps down through
	// the abort path, which does not count Lost (see the report); its
	// release then fails with "lease: lost".
	switch {
	case st.Lost >= 1 || logContains(victim, "partition lease lost"):
		t.Logf("resumed worker stepped down: lease lost (Lost=%d)", st.Lost)
	case logContains(victim, "stale fence"):
		t.Logf("resumed worker stepped down on a stale fence")
	case logContains(victim, "partition consumer deleted under us; stepping down") && logContains(victim, "lease: lost: release"):
		t.Logf("resumed worker stepped down when it found its consumer re-created by the successor; stats Lost=%d undercounts", st.Lost)
	default:
		t.Errorf("resumed worker did not step down: Lost=%d and its log shows no lease loss, stale fence or step-down", st.Lost)
	}
	switch {
	case st.Stale > 0:
		t.Logf("late writes refused by the fence check (Stale=%d, Unacked=%d, Lost=%d)", st.Stale, st.Unacked, st.Lost)
	case st.Unacked > 0 || st.Lost > 0:
		t.Logf("late effects never happened: the resumed worker saw its trust window closed (Unacked=%d, Lost=%d)", st.Unacked, st.Lost)
	default:
		t.Errorf("no sign that late effects were rejected: Stale=%d Unacked=%d Lost=%d", st.Stale, st.Unacked, st.Lost)
	}
}

// TestGracefulStop sends SIGTERM to a worker under load. It must finish its
// jobs, hand its partitions over in well under a second (DESIGN promise 5)
// and exit 0; no job may run twice.
func TestGracefulStop(t *testing.T) {
	c := startCluster(t, "e2e-graceful", 3)
	b, skus, initial := startLoad(t, c, "graceful")
	b.waitCompleted(t, 500, 60*time.Second)

	victim, parts := victimOf(t, c, skus)
	termed := time.Now()
	exit, err := c.stop(victim, 12*time.Second)
	if err != nil {
		t.Errorf("worker %s exited with %v after SIGTERM\n%s", victim.id, err, tail(victim.stderr, 20))
	}
	if exit > 10*time.Second {
		t.Errorf("worker took %s to exit, more than its --drain of 10s", exit)
	}
	last := c.waitTakenOver(parts, victim.id, termed, 15*time.Second)
	handover := last.Sub(termed)
	t.Logf("graceful stop: %s exited %s after SIGTERM; partitions %v handed over after %s",
		victim.id, exit.Round(time.Millisecond), parts, handover.Round(time.Millisecond))
	if handover > 2*time.Second {
		t.Errorf("hand-over took %s, more than 2s", handover)
	}
	c.waitBalanced(10 * time.Second)
	b.waitCompleted(t, b.completed()+500, 60*time.Second)
	ps := finishLoad(t, c, b, skus, initial)
	logSlowest(t, ps)
	c.stopGraceful(15 * time.Second)

	if st := readStats(t, victim); st.Lost != 0 || st.Unacked != 0 {
		t.Errorf("stopped worker lost leases or left jobs unacked: %+v", st)
	}
	rep := checkTrace(t, readTraces(t, c.traceFiles()), ps, traceRules{once: true})
	t.Logf("%d purchases; trace: %d runs of %d jobs, max concurrent runs per key %d", len(ps), rep.runs, rep.jobs, rep.maxConcurrent)
}
