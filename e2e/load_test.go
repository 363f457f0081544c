package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
)

// callTimeout bounds one purchase: long enough to ride out a failover.
const callTimeout = 60 * time.Second

// purchase is one "buy 1" as the buyer saw it.
type purchase struct {
	id         string
	sku        int
	reply      string
	err        error
	start, end time.Time
}

// buyers run purchases on a fixed pool of goroutines until max purchases
// were made or stop is called. Each purchase is a Call with its own job ID.
type buyers struct {
	c      *cluster
	skus   []string
	prefix string
	pick   func(i int) int
	max    int

	next   atomic.Int64
	stopCh chan struct{}
	wg     sync.WaitGroup

	mu   sync.Mutex
	done []purchase
}

// startBuyers starts n buyers making up to max purchases; purchase i buys
// skus[pick(i)] with job ID prefix-i.
func (c *cluster) startBuyers(n int, skus []string, prefix string, max int, pick func(int) int) *buyers {
	b := &buyers{c: c, skus: skus, prefix: prefix, pick: pick, max: max, stopCh: make(chan struct{})}
	b.wg.Add(n)
	for range n {
		go b.run()
	}
	return b
}

func (b *buyers) run() {
	defer b.wg.Done()
	for {
		select {
		case <-b.stopCh:
			return
		default:
		}
		i := int(b.next.Add(1) - 1)
		if i >= b.max {
			return
		}
		p := purchase{id: b.prefix + "-" + strconv.Itoa(i), sku: b.pick(i), start: time.Now()}
		// With batches, three purchases in four go without a caller's ID
		// (only those travel in batch messages), named in the trace by
		// sale.OpHeader; the fourth keeps its ID and goes alone.
		opt := keylane.WithID(p.id)
		if b.c.batches() && i%4 != 0 {
			opt = keylane.WithHeader(sale.OpHeader, p.id)
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		res, err := b.c.client.Call(ctx, b.skus[p.sku], []byte("buy 1"), opt)
		cancel()
		p.reply, p.err, p.end = string(res), err, time.Now()
		b.mu.Lock()
		b.done = append(b.done, p)
		b.mu.Unlock()
	}
}

// completed returns how many purchases have returned.
func (b *buyers) completed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.done)
}

// waitCompleted polls until at least n purchases returned.
func (b *buyers) waitCompleted(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	testwait.Until(t, timeout, fmt.Sprintf("%d purchases returned", n), func() (int, bool) {
		done := b.completed()
		return done, done >= n
	})
}

// stop lets in-flight purchases finish, starts no more, and returns them all.
func (b *buyers) stop() []purchase {
	close(b.stopCh)
	return b.wait()
}

// wait waits until the buyers are done and returns every purchase.
func (b *buyers) wait() []purchase {
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.done)
}

// checkPurchases checks that every purchase was answered "sold N" or
// "soldout N" and returns demand and units sold per SKU.
func checkPurchases(t *testing.T, ps []purchase, nSKU int) (demand, sold []int64) {
	t.Helper()
	demand, sold = make([]int64, nSKU), make([]int64, nSKU)
	ids := map[string]bool{}
	bad := 0
	for _, p := range ps {
		if ids[p.id] {
			t.Errorf("purchase %s made twice by the test", p.id)
		}
		ids[p.id] = true
		demand[p.sku]++
		switch {
		case p.err != nil:
			bad++
			if bad <= 5 {
				t.Errorf("purchase %s (sku %d) failed after %s: %v", p.id, p.sku, p.end.Sub(p.start).Round(time.Millisecond), p.err)
			}
		case strings.HasPrefix(p.reply, "sold "):
			sold[p.sku]++
		case strings.HasPrefix(p.reply, "soldout "):
		default:
			bad++
			if bad <= 5 {
				t.Errorf("purchase %s (sku %d): unexpected reply %q", p.id, p.sku, p.reply)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d purchases got no proper reply", bad, len(ps))
	}
	return demand, sold
}

// checkStock reads every SKU's final stock and checks it against the
// demand: exactly min(stock, demand) units left, and as many "sold" replies
// as units left the shelf. It returns how many SKUs sold out.
func checkStock(t *testing.T, c *cluster, skus []string, initial, demand, sold []int64) int {
	t.Helper()
	soldOut := 0
	for i, s := range skus {
		final := c.stock(s)
		want := initial[i] - min(initial[i], demand[i])
		if final != want {
			t.Errorf("%s: final stock %d, want %d (stock %d, demand %d)", s, final, want, initial[i], demand[i])
		}
		if sold[i] != initial[i]-final {
			t.Errorf("%s: %d \"sold\" replies, but stock went from %d to %d", s, sold[i], initial[i], final)
		}
		if final == 0 {
			soldOut++
		}
	}
	return soldOut
}

// readTraces reads the JSON run lines of the given trace files. A worker
// killed mid-write may leave a torn last line; it is skipped.
func readTraces(t *testing.T, files []string) []sale.Span {
	t.Helper()
	var runs []sale.Span
	for _, f := range files {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r sale.Span
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				if !bytes.HasSuffix(b, append(slices.Clone(sc.Bytes()), '\n')) {
					t.Logf("%s: torn trace line skipped: %q", f, sc.Bytes())
					continue
				}
				t.Fatalf("%s: bad trace line %q: %v", f, sc.Bytes(), err)
			}
			if r.Op != "" {
				// A job without a caller's ID, named by the test in
				// sale.OpHeader: the test knows it by that name.
				r.Job = r.Op
			}
			runs = append(runs, r)
		}
	}
	return runs
}

// reporter is the part of *testing.T the checkers use.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// traceRules says what a trace must show.
type traceRules struct {
	// once: every job ran exactly once (no redelivery at all).
	once bool
	// mayLoseApplied: a job may have no applied run in the trace, for jobs
	// of these workers killed before they could write the line.
	mayLoseApplied bool
	// ignoreOverlap leaves runs out of the one-at-a-time check (a paused
	// worker's run spans its pause by design).
	ignoreOverlap func(sale.Span) bool
	// unknownWrite tells runs whose state write may have landed although
	// the run was logged as not applied: a paused worker's write reached
	// the server before the pause and its answer came after SIGCONT, when
	// the worker no longer trusted its lease (context canceled). The
	// successor then answered the job from the held outcome without running
	// it. A purchase with a good reply and only such runs counts as applied;
	// the stock check vouches for exactly-once.
	unknownWrite func(sale.Span) bool
}

// traceReport is what checkTrace found, for logging.
type traceReport struct {
	runs, jobs, reruns, lostApplied int
	maxConcurrent                   int
}

// checkTrace checks the merged trace of all workers against the purchases:
//   - every purchase ran at least once, and applied its effect at most once
//     (exactly once unless rules.mayLoseApplied);
//   - with rules.once, every job ID of the trace ran exactly once;
//   - at most one run per key at any time, from the [start,end] intervals;
//   - per key, applied runs in increasing stream order with non-decreasing
//     fence (a stale owner never wrote after a newer one), and with
//     rules.once all runs of a key started in increasing stream order.
func checkTrace(t reporter, runs []sale.Span, ps []purchase, rules traceRules) traceReport {
	t.Helper()
	rep := traceReport{runs: len(runs)}
	byID := map[string][]sale.Span{}
	byKey := map[string][]sale.Span{}
	for _, r := range runs {
		byID[r.Job] = append(byID[r.Job], r)
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	rep.jobs = len(byID)
	errs := 0
	report := func(format string, args ...any) {
		errs++
		if errs <= 10 {
			t.Errorf(format, args...)
		}
	}
	for id, rs := range byID {
		applied := 0
		for _, r := range rs {
			if r.Applied {
				applied++
			}
		}
		if len(rs) > 1 {
			rep.reruns++
			if rules.once {
				report("job %s ran %d times: %+v", id, len(rs), rs)
			}
		}
		if applied > 1 {
			report("job %s applied %d times: %+v", id, applied, rs)
		}
	}
	for _, p := range ps {
		rs := byID[p.id]
		if len(rs) == 0 {
			if rules.mayLoseApplied && p.err == nil && p.reply != "" {
				// A killed worker's group write landed but it died
				// before logging the group's runs; the successor answered
				// the redelivered jobs from the stored results without
				// running them. The reply and the stock check vouch for it.
				rep.lostApplied++
				continue
			}
			report("purchase %s never ran (reply %q, err %v)", p.id, p.reply, p.err)
			continue
		}
		applied := 0
		for _, r := range rs {
			if r.Applied {
				applied++
			}
		}
		if applied == 0 {
			// A run whose write was sent and never answered (Unknown:
			// the worker's lease trust ended under it on a loaded
			// machine) may have landed, as may one the rules name.
			unknown := p.err == nil && p.reply != ""
			for _, r := range rs {
				unknown = unknown && (r.Unknown || rules.unknownWrite != nil && rules.unknownWrite(r))
			}
			if rules.mayLoseApplied || unknown {
				rep.lostApplied++
			} else {
				report("purchase %s has no applied run: %+v", p.id, rs)
			}
		}
	}
	for key, rs := range byKey {
		// One at a time: sweep the runs in start order, tracking the ends
		// of those still running.
		slices.SortFunc(rs, func(a, b sale.Span) int { return cmp.Compare(a.Start, b.Start) })
		var running []int64
		for _, r := range rs {
			if rules.ignoreOverlap != nil && rules.ignoreOverlap(r) {
				continue
			}
			running = slices.DeleteFunc(running, func(end int64) bool { return end <= r.Start })
			running = append(running, r.End)
			if len(running) > rep.maxConcurrent {
				rep.maxConcurrent = len(running)
			}
			if len(running) > 1 {
				report("key %s: run of job %s (seq %d, %s) overlaps %d other run(s)", key, r.Job, r.Seq, r.Worker, len(running)-1)
			}
		}
		if rules.once {
			for i := 1; i < len(rs); i++ {
				if streamOrder(rs[i], rs[i-1]) <= 0 {
					report("key %s: job %s (%s) started after job %s (%s)", key, rs[i].Job, posOf(rs[i]), rs[i-1].Job, posOf(rs[i-1]))
				}
			}
		}
		var applied []sale.Span
		for _, r := range rs {
			if r.Applied {
				applied = append(applied, r)
			}
		}
		for i := 1; i < len(applied); i++ {
			a, b := applied[i-1], applied[i]
			if streamOrder(b, a) <= 0 {
				report("key %s: job %s (%s) applied after job %s (%s)", key, b.Job, posOf(b), a.Job, posOf(a))
			}
			if b.Fence < a.Fence {
				report("key %s: job %s applied with fence %d after job %s wrote with fence %d", key, b.Job, b.Fence, a.Job, a.Fence)
			}
		}
	}
	if errs > 10 {
		t.Errorf("... and %d more trace violations", errs-10)
	}
	return rep
}

// replyCounter counts, on its own connection, every purchase reply the
// workers publish, by reply subject: each Call has its own subject, so a
// count above one is a second reply to the same job. A grouped reply's
// entries count each under its own Call's subject.
type replyCounter struct {
	nc  *nats.Conn
	sub *nats.Subscription
	mu  sync.Mutex
	n   map[string]int
}

func countReplies(t *testing.T) *replyCounter {
	t.Helper()
	nc, err := nats.Connect(natsURL, nats.Name("e2e-replies"))
	if err != nil {
		t.Fatal(err)
	}
	rc := &replyCounter{nc: nc, n: map[string]int{}}
	rc.sub, err = nc.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if inbox, ok := strings.CutSuffix(m.Subject, ".-"); ok {
			// A grouped reply: the outcomes of several Calls of one client,
			// each counted under its own Call's reply subject.
			outs, err := keylane.DecodeGroupedReply(m.Data)
			if err != nil {
				t.Errorf("malformed grouped reply on %s: %v", m.Subject, err)
				return
			}
			rc.mu.Lock()
			for _, o := range outs {
				if bytes.HasPrefix(o.Result, []byte("sold")) {
					rc.n[inbox+"."+o.Token]++
				}
			}
			rc.mu.Unlock()
			return
		}
		if !bytes.HasPrefix(m.Data, []byte("sold")) {
			return // JetStream API replies, stock reads
		}
		rc.mu.Lock()
		rc.n[m.Subject]++
		rc.mu.Unlock()
	})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	_ = rc.sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return rc
}

// check waits until want replies were counted and reports duplicates.
func (rc *replyCounter) check(t *testing.T, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rc.mu.Lock()
		total, subjects, dups := 0, len(rc.n), 0
		for _, n := range rc.n {
			total += n
			if n > 1 {
				dups++
			}
		}
		rc.mu.Unlock()
		if dups > 0 {
			t.Errorf("%d purchases got more than one reply (%d replies on %d subjects)", dups, total, subjects)
			return
		}
		if subjects == want && total == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("counted %d purchase replies on %d subjects, want %d", total, subjects, want)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func skuNames(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("%s:%d", prefix, i)
	}
	return s
}
