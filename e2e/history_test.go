package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/inventory"
)

// histOp is one call a test made, as the caller saw it.
type histOp struct {
	ID, Key, Payload string
	// Call is true for a Call (the caller waited for the result), false
	// for a Submit (the caller waited for the stream's ack only).
	Call           bool
	Reply          string
	Err            error
	Invoke, Return time.Time
}

// acked reports whether keylane acknowledged the op: a Call got a result,
// a Submit got the stream's ack. An acknowledged job must take effect
// exactly once; an op with an error may take effect once or not at all.
func (o histOp) acked() bool { return o.Err == nil }

func (o histOp) String() string {
	kind := "submit"
	if o.Call {
		kind = "call"
	}
	return fmt.Sprintf("%s %s %s %q -> %q err=%v (%s)", kind, o.ID, o.Key, o.Payload, o.Reply, o.Err, o.Return.Sub(o.Invoke).Round(time.Millisecond))
}

// history records every Call and Submit a test makes through it. It is
// safe for concurrent use.
type history struct {
	client  func() *keylane.Client // the client to use now (a test may replace it)
	prefix  string                 // job IDs are prefix-<n>
	timeout time.Duration          // bounds each op
	next    atomic.Int64

	mu  sync.Mutex
	ops []histOp
}

func newHistory(prefix string, client func() *keylane.Client) *history {
	return &history{client: client, prefix: prefix, timeout: callTimeout}
}

func (h *history) newID() string {
	return h.prefix + "-" + strconv.FormatInt(h.next.Add(1), 10)
}

func (h *history) record(o histOp) {
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

// call runs a Call with a fresh job ID and records it.
func (h *history) call(key, payload string) histOp {
	o := histOp{ID: h.newID(), Key: key, Payload: payload, Call: true, Invoke: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	res, err := h.client().Call(ctx, key, []byte(payload), keylane.WithID(o.ID))
	cancel()
	o.Reply, o.Err, o.Return = string(res), err, time.Now()
	h.record(o)
	return o
}

// submit runs a Submit with a fresh job ID and records it.
func (h *history) submit(key, payload string) histOp {
	o := histOp{ID: h.newID(), Key: key, Payload: payload, Invoke: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	_, err := h.client().Submit(ctx, key, []byte(payload), keylane.WithID(o.ID))
	cancel()
	o.Err, o.Return = err, time.Now()
	h.record(o)
	return o
}

// callNoID runs a Call without a caller's ID (keylane draws one; with
// ClientConfig.Batches such a Call travels in a batch message) and records
// it under a name of the test's own, sent as the job's sale.OpHeader so
// that its runs in the trace are matched to it (readTraces).
func (h *history) callNoID(key, payload string) histOp {
	o := histOp{ID: h.newID(), Key: key, Payload: payload, Call: true, Invoke: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	res, err := h.client().Call(ctx, key, []byte(payload), keylane.WithHeader(sale.OpHeader, o.ID))
	cancel()
	o.Reply, o.Err, o.Return = string(res), err, time.Now()
	h.record(o)
	return o
}

// submitNoID runs a Submit without a caller's ID and records it, as
// callNoID does.
func (h *history) submitNoID(key, payload string) histOp {
	o := histOp{ID: h.newID(), Key: key, Payload: payload, Invoke: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	_, err := h.client().Submit(ctx, key, []byte(payload), keylane.WithHeader(sale.OpHeader, o.ID))
	cancel()
	o.Err, o.Return = err, time.Now()
	h.record(o)
	return o
}

// all returns every recorded op.
func (h *history) all() []histOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// historyRules says how much a history's trace can be trusted.
type historyRules struct {
	// lossy: workers were killed (SIGKILL), so a group whose state write
	// landed may have no trace lines: the successor answered its jobs from
	// the stored results without running them. An acknowledged Call with a
	// well-formed reply then vouches for its own effect, and a key with
	// such a job is checked by arithmetic on the replies instead of by
	// folding its trace.
	lossy bool
	// strictOverlap checks one run per key at a time over every run, not
	// only over applied ones. Without it, a run that did not apply (a
	// paused or deposed owner's) may overlap others.
	strictOverlap bool
}

// historyReport is what checkHistory saw, for logging.
type historyReport struct {
	ops, acked, unknown, runs, applied, reruns int
	vouched, presumed, foldedKeys, boundedKeys int
	maxConcurrent                              int
}

func (r historyReport) String() string {
	return fmt.Sprintf("%d ops (%d acknowledged, %d unknown outcome); %d runs, %d applied, %d jobs ran more than once; %d presumed applied by a write of unknown outcome, %d acknowledged only by their reply; %d keys folded, %d bounded; max runs of one key at once %d",
		r.ops, r.acked, r.unknown, r.runs, r.applied, r.reruns, r.presumed, r.vouched, r.foldedKeys, r.boundedKeys, r.maxConcurrent)
}

// checkHistory checks the ops a test made against the runs the workers'
// traces recorded, for the inventory commands (set, restock, buy, get) on
// keys that start unwritten (stock 0):
//
//   - no job is applied more than once, and every acknowledged job is
//     applied exactly once (lossy: or vouched for by its reply). A job
//     whose runs all say "not applied" but that was acknowledged with a
//     well-formed reply is presumed applied at its sequence: the tracer
//     hears "not applied" for a group write of unknown outcome that may
//     have landed (see CommitObserver), and the fold then checks the
//     presumption;
//   - an acknowledged Call's reply is well-formed for its command (an
//     empty success is a lost job);
//   - per key, the applied runs, in the order they ran, are in stream
//     (sequence) order with non-decreasing fences;
//   - per key, at most one run at a time (applied runs, or all with
//     strictOverlap);
//   - per key, folding the applied jobs in stream order over the
//     inventory model gives exactly every acknowledged Call's reply, and
//     its last state equals final[key] (the stock read after the test).
//     Keys whose fold has a gap (lossy) are bounded instead: final must be
//     the last acknowledged "set" plus acknowledged restocks minus "sold"
//     replies, give or take the ops of unknown outcome.
//
// This is a hand-written fold, not a linearizability search: the trace
// gives the stream order, which fixes the one serial order keylane
// promises, so there is nothing to search for.
func checkHistory(t reporter, ops []histOp, runs []sale.Span, final map[string]int64, rules historyRules) historyReport {
	t.Helper()
	rep := historyReport{ops: len(ops), runs: len(runs)}
	errs := 0
	report := func(format string, args ...any) {
		t.Helper()
		errs++
		if errs <= 20 {
			t.Errorf(format, args...)
		}
	}
	defer func() {
		if errs > 20 {
			t.Errorf("... and %d more history violations", errs-20)
		}
	}()

	byID := map[string]histOp{}
	for _, o := range ops {
		if _, dup := byID[o.ID]; dup {
			report("job ID %s used twice by the test", o.ID)
		}
		byID[o.ID] = o
		if o.acked() {
			rep.acked++
		} else {
			rep.unknown++
		}
	}
	runsOf := map[string][]sale.Span{}
	appliedOf := map[string][]sale.Span{}
	byKey := map[string][]sale.Span{}
	for _, r := range runs {
		runsOf[r.Job] = append(runsOf[r.Job], r)
		byKey[r.Key] = append(byKey[r.Key], r)
		if r.Applied {
			rep.applied++
			appliedOf[r.Job] = append(appliedOf[r.Job], r)
			if _, ok := byID[r.Job]; !ok {
				report("job %s (key %s, seq %d) applied by %s, but the test never made it", r.Job, r.Key, r.Seq, r.Worker)
			}
		}
	}
	for id, rs := range runsOf {
		if len(rs) > 1 {
			rep.reruns++
		}
		if n := len(appliedOf[id]); n > 1 {
			report("job %s applied %d times: %+v", id, n, appliedOf[id])
		}
	}

	// Every acknowledged job: a well-formed reply, and applied once.
	gaps := map[string]int{} // key -> acknowledged jobs with no applied run
	var presumed []sale.Span
	for _, o := range ops {
		if !o.acked() {
			continue
		}
		if o.Call && !wellFormed(o.Payload, o.Reply) {
			report("job %s (%s %q) acknowledged with reply %q: not an outcome of that command (an empty success is a lost job)", o.ID, o.Key, o.Payload, o.Reply)
		}
		if len(appliedOf[o.ID]) > 0 {
			continue
		}
		if rs := runsOf[o.ID]; len(rs) > 0 && (!o.Call || wellFormed(o.Payload, o.Reply)) {
			// It ran, and a group write of unknown outcome (a timeout)
			// told the tracer "not applied"; the write may have landed,
			// and the one-by-one settling that followed answered the job
			// from the stored entry without running it again. Presume it
			// applied at its sequence: the fold checks the presumption
			// against every later reply and the final stock.
			rep.presumed++
			presumed = append(presumed, sale.Span{Worker: rs[0].Worker, Job: o.ID, Key: o.Key, Seq: rs[0].Seq, Index: rs[0].Index, Fence: rs[0].Fence, Applied: true})
			continue
		}
		if rules.lossy && (!o.Call || wellFormed(o.Payload, o.Reply)) {
			rep.vouched++
			gaps[o.Key]++
			continue
		}
		report("job %s (%s %q) acknowledged (reply %q) but never applied; its runs: %+v", o.ID, o.Key, o.Payload, o.Reply, runsOf[o.ID])
	}

	keys := map[string]bool{}
	for k := range byKey {
		keys[k] = true
	}
	for _, o := range ops {
		keys[o.Key] = true
	}
	for _, key := range slices.Sorted(mapKeys(keys)) {
		rs := byKey[key]
		slices.SortFunc(rs, func(a, b sale.Span) int { return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.End, b.End)) })
		var applied []sale.Span
		for _, r := range rs {
			if r.Applied {
				applied = append(applied, r)
			}
		}

		// One at a time: sweep in start order, keeping the ends of the
		// runs still going.
		var running []int64
		for _, r := range rs {
			if !rules.strictOverlap && !r.Applied {
				continue
			}
			running = slices.DeleteFunc(running, func(end int64) bool { return end <= r.Start })
			running = append(running, r.End)
			rep.maxConcurrent = max(rep.maxConcurrent, len(running))
			if len(running) > 1 {
				report("key %s: run of job %s (seq %d, %s) overlaps %d other run(s)", key, r.Job, r.Seq, r.Worker, len(running)-1)
			}
		}

		// Effects in stream order, fences never going back.
		for i := 1; i < len(applied); i++ {
			a, b := applied[i-1], applied[i]
			if streamOrder(b, a) <= 0 {
				report("key %s: job %s (%s) applied after job %s (%s)", key, b.Job, posOf(b), a.Job, posOf(a))
			}
			if b.Fence < a.Fence {
				report("key %s: job %s applied with fence %d after job %s wrote with fence %d", key, b.Job, b.Fence, a.Job, a.Fence)
			}
		}

		want, haveFinal := final[key]
		if gaps[key] == 0 {
			rep.foldedKeys++
			// Fold the applied jobs in stream order: the one serial order.
			bySeq := slices.Clone(applied)
			for _, r := range presumed {
				if r.Key == key {
					bySeq = append(bySeq, r)
				}
			}
			slices.SortFunc(bySeq, streamOrder)
			var stock int64
			for _, r := range bySeq {
				o, ok := byID[r.Job]
				if !ok {
					continue // reported above
				}
				var out string
				stock, out = model(stock, o.Payload)
				if o.Call && o.acked() && o.Reply != out {
					report("key %s: job %s (%q, seq %d) got %q, but the applied jobs in stream order give %q", key, o.ID, o.Payload, r.Seq, o.Reply, out)
				}
			}
			if haveFinal && stock != want {
				report("key %s: final stock %d, but the applied jobs in stream order give %d", key, want, stock)
			}
			continue
		}
		rep.boundedKeys++
		if !haveFinal {
			continue
		}
		lo, hi, why := bounds(key, ops)
		if why != "" {
			report("key %s: %d acknowledged jobs without a trace line and %s: cannot check it", key, gaps[key], why)
			continue
		}
		if want < lo || want > hi {
			report("key %s: final stock %d, but the acknowledged jobs allow only [%d, %d]", key, want, lo, hi)
		}
	}
	return rep
}

// streamOrder compares two runs' jobs by their place in the stream: the
// message's sequence, then the job's index in a batch message (jobs of one
// batch share the sequence).
func streamOrder(a, b sale.Span) int {
	return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Index, b.Index))
}

// posOf names a run's place in the stream for a report.
func posOf(r sale.Span) string {
	if r.Index == 0 {
		return fmt.Sprintf("seq %d", r.Seq)
	}
	return fmt.Sprintf("seq %d index %d", r.Seq, r.Index)
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// bounds returns the range the final stock of key must lie in, from the
// replies alone: the last acknowledged set, plus restocks, minus "sold"
// buys after it, with the ops of unknown outcome counted both ways. why is
// set when the history does not allow it (a set of unknown outcome, or one
// not followed strictly by the rest).
func bounds(key string, ops []histOp) (lo, hi int64, why string) {
	var set *histOp
	for i := range ops {
		o := &ops[i]
		if o.Key == key && strings.HasPrefix(o.Payload, "set ") {
			if set != nil || !o.acked() {
				return 0, 0, "more than one set, or one of unknown outcome"
			}
			set = o
		}
	}
	if set != nil {
		lo, _ = strconv.ParseInt(strings.TrimPrefix(set.Payload, "set "), 10, 64)
	}
	hi = lo
	setID := ""
	if set != nil {
		setID = set.ID
	}
	for _, o := range ops {
		if o.Key != key || o.ID == setID {
			continue
		}
		if set != nil && o.Invoke.Before(set.Return) {
			return 0, 0, "an op that overlaps the set"
		}
		cmd, err := inventory.Parse([]byte(o.Payload))
		if err != nil {
			return 0, 0, fmt.Sprintf("op %s has a bad payload", o.ID)
		}
		switch cmd.Op {
		case "restock":
			if o.acked() {
				lo += cmd.N
			}
			hi += cmd.N
		case "buy":
			switch {
			case o.acked() && o.Call && strings.HasPrefix(o.Reply, "sold "):
				lo -= cmd.N
				hi -= cmd.N
			case o.acked() && o.Call: // soldout: no effect
			default: // a Submit, or unknown: sold or not
				lo -= cmd.N
			}
		}
	}
	return lo, hi, ""
}

// model applies one inventory command to the stock and returns the reply
// the handler must give. It is written from the command table in package
// inventory's doc, not from its code.
func model(stock int64, payload string) (int64, string) {
	cmd, err := inventory.Parse([]byte(payload))
	if err != nil {
		return stock, "bad command"
	}
	switch cmd.Op {
	case "set":
		return cmd.N, "ok " + strconv.FormatInt(cmd.N, 10)
	case "restock":
		stock += cmd.N
		return stock, "ok " + strconv.FormatInt(stock, 10)
	case "buy":
		if stock >= cmd.N {
			stock -= cmd.N
			return stock, "sold " + strconv.FormatInt(stock, 10)
		}
		return stock, "soldout " + strconv.FormatInt(stock, 10)
	case "get":
		return stock, "stock " + strconv.FormatInt(stock, 10)
	}
	return stock, "bad command"
}

// wellFormed reports whether reply can be an outcome of the command.
func wellFormed(payload, reply string) bool {
	cmd, err := inventory.Parse([]byte(payload))
	if err != nil {
		return false
	}
	var prefixes []string
	switch cmd.Op {
	case "set", "restock":
		prefixes = []string{"ok "}
	case "buy":
		prefixes = []string{"sold ", "soldout "}
	case "get":
		prefixes = []string{"stock "}
	}
	for _, p := range prefixes {
		if n, ok := strings.CutPrefix(reply, p); ok {
			_, err := strconv.ParseInt(n, 10, 64)
			return err == nil
		}
	}
	return false
}
