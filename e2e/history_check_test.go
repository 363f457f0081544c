package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/sale"
)

// TestCheckHistoryCatches feeds checkHistory histories that break each of
// its rules and checks that it complains, and that it passes clean ones:
// the fault tests are only as good as it.
func TestCheckHistoryCatches(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	call := func(id, key, payload, reply string, from, to int) histOp {
		return histOp{ID: id, Key: key, Payload: payload, Call: true, Reply: reply, Invoke: at(from), Return: at(to)}
	}
	submit := func(id, key, payload string, from, to int) histOp {
		return histOp{ID: id, Key: key, Payload: payload, Invoke: at(from), Return: at(to)}
	}
	failed := func(o histOp) histOp { o.Err, o.Reply = errors.New("keylane: no reply"), ""; return o }
	run := func(w, job, key string, seq, fence uint64, from, to int, applied bool) sale.Span {
		return sale.Span{Worker: w, Job: job, Key: key, Seq: seq, Fence: fence, Start: at(from).UnixNano(), End: at(to).UnixNano(), Applied: applied}
	}
	// A clean history: set 3, two buys by Call, a restock by Submit, a
	// buy, all on k; applied in stream order.
	cleanOps := []histOp{
		call("s", "k", "set 3", "ok 3", 0, 10),
		call("a", "k", "buy 1", "sold 2", 20, 40),
		call("b", "k", "buy 1", "sold 1", 21, 50),
		submit("r", "k", "restock 5", 22, 23),
		call("c", "k", "buy 2", "sold 4", 60, 70),
	}
	cleanRuns := []sale.Span{
		run("w0", "s", "k", 1, 5, 1, 2, true),
		run("w0", "a", "k", 2, 5, 25, 26, true),
		run("w0", "b", "k", 3, 5, 26, 27, true),
		run("w0", "r", "k", 4, 5, 27, 28, true),
		run("w0", "c", "k", 5, 5, 61, 62, true),
	}
	final := map[string]int64{"k": 4}
	with := func(ops []histOp, i int, o histOp) []histOp {
		ops = append([]histOp(nil), ops...)
		ops[i] = o
		return ops
	}
	withRun := func(rs []sale.Span, i int, r sale.Span) []sale.Span {
		rs = append([]sale.Span(nil), rs...)
		rs[i] = r
		return rs
	}
	without := func(rs []sale.Span, i int) []sale.Span {
		return append(append([]sale.Span(nil), rs[:i]...), rs[i+1:]...)
	}
	// inBatch is r as a job at index i of a batch message stored at seq:
	// jobs of one batch share the sequence.
	inBatch := func(r sale.Span, seq uint64, i int) sale.Span { r.Seq, r.Index = seq, i; return r }
	batchRuns := []sale.Span{cleanRuns[0], inBatch(cleanRuns[1], 2, 0), inBatch(cleanRuns[2], 2, 1), inBatch(cleanRuns[3], 2, 2), cleanRuns[4]}

	for _, tc := range []struct {
		name  string
		ops   []histOp
		runs  []sale.Span
		final map[string]int64
		rules historyRules
		want  string // "" for a clean history
	}{
		{"clean", cleanOps, cleanRuns, final, historyRules{strictOverlap: true}, ""},
		{"clean with a rerun that did not apply", cleanOps,
			append(cleanRuns, run("w1", "c", "k", 5, 4, 61, 65, false)), final, historyRules{}, ""},
		{"a failed call that never ran", append(cleanOps, failed(call("x", "k", "buy 1", "", 80, 90))), cleanRuns, final, historyRules{}, ""},
		{"a failed call that applied", append(cleanOps, failed(call("x", "k", "buy 1", "", 80, 90)), call("g", "k", "get", "stock 3", 95, 99)),
			append(cleanRuns, run("w0", "x", "k", 6, 5, 81, 82, true), run("w0", "g", "k", 7, 5, 96, 97, true)), map[string]int64{"k": 3}, historyRules{}, ""},

		// A group write timed out but landed: the tracer heard "not
		// applied", the settling that followed answered b from the
		// stored entry. The fold accepts b at its sequence only if the
		// later replies agree.
		{"unknown-outcome write that landed", cleanOps, withRun(cleanRuns, 2, run("w0", "b", "k", 3, 5, 26, 27, false)), final, historyRules{}, ""},
		{"presumed applied but was not", with(with(cleanOps, 3, submit("r", "k", "restock 6", 22, 23)), 4, call("c", "k", "buy 2", "sold 6", 60, 70)),
			withRun(cleanRuns, 2, run("w0", "b", "k", 3, 5, 26, 27, false)), map[string]int64{"k": 6}, historyRules{}, `got "sold 6", but the applied jobs in stream order give "sold 5"`},

		// The stray-puller bug: a job acknowledged with an empty result
		// and no effect.
		{"lost job, empty success", with(cleanOps, 1, call("a", "k", "buy 1", "", 20, 2000)), without(cleanRuns, 1), map[string]int64{"k": 5}, historyRules{}, `acknowledged with reply ""`},
		{"lost job, never applied", with(cleanOps, 1, call("a", "k", "buy 1", "", 20, 2000)), without(cleanRuns, 1), map[string]int64{"k": 5}, historyRules{}, "but never applied"},
		{"lost submit", cleanOps, without(cleanRuns, 3), map[string]int64{"k": -1}, historyRules{}, "job r (k \"restock 5\") acknowledged"},
		{"applied twice", cleanOps, append(cleanRuns, run("w1", "b", "k", 3, 6, 80, 81, true)), final, historyRules{}, "applied 2 times"},
		{"out of stream order", cleanOps, withRun(withRun(cleanRuns, 1, run("w0", "a", "k", 3, 5, 25, 26, true)), 2, run("w0", "b", "k", 2, 5, 26, 27, true)), final, historyRules{}, "applied after"},
		{"clean, a, b and r in one batch", cleanOps, batchRuns, final, historyRules{strictOverlap: true}, ""},
		{"out of index order in one batch", cleanOps, withRun(withRun(batchRuns, 1, inBatch(cleanRuns[1], 2, 1)), 2, inBatch(cleanRuns[2], 2, 0)), final, historyRules{}, "(seq 2) applied after job a (seq 2 index 1)"},
		{"overlap of applied runs", cleanOps, withRun(cleanRuns, 2, run("w1", "b", "k", 3, 5, 25, 27, true)), final, historyRules{}, "overlaps"},
		{"overlap of any run, strict", cleanOps, append(cleanRuns, run("w1", "z", "k", 9, 4, 24, 30, false)), final, historyRules{strictOverlap: true}, "overlaps"},
		{"stale fence wrote last", cleanOps, withRun(cleanRuns, 4, run("w0", "c", "k", 5, 4, 61, 62, true)), final, historyRules{}, "fence 4 after"},
		{"wrong reply", with(cleanOps, 2, call("b", "k", "buy 1", "sold 2", 21, 50)), cleanRuns, final, historyRules{}, `got "sold 2", but the applied jobs in stream order give "sold 1"`},
		{"wrong final", cleanOps, cleanRuns, map[string]int64{"k": 5}, historyRules{}, "final stock 5"},
		{"applied job the test never made", cleanOps, append(cleanRuns, run("w0", "zz", "k", 6, 5, 80, 81, true)), final, historyRules{}, "never made it"},
		{"malformed reply", with(cleanOps, 4, call("c", "k", "buy 2", "stock 4", 60, 70)), cleanRuns, final, historyRules{}, `reply "stock 4"`},

		// Lossy: a killed worker's group left no trace lines; the replies
		// vouch for the jobs and the final stock is bounded by them.
		{"lossy, vouched", cleanOps, without(cleanRuns, 2), final, historyRules{lossy: true}, ""},
		{"lossy, vouched submit", cleanOps, without(cleanRuns, 3), final, historyRules{lossy: true}, ""},
		{"lossy, empty success still caught", with(cleanOps, 1, call("a", "k", "buy 1", "", 20, 2000)), without(cleanRuns, 1), map[string]int64{"k": 5}, historyRules{lossy: true}, `acknowledged with reply ""`},
		{"lossy, final out of bounds", cleanOps, without(cleanRuns, 2), map[string]int64{"k": 5}, historyRules{lossy: true}, "allow only [4, 4]"},
		{"lossy, unknown buy widens the bounds", append(cleanOps, failed(call("x", "k", "buy 1", "", 80, 90))), without(cleanRuns, 2), map[string]int64{"k": 3}, historyRules{lossy: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &recordingT{}
			checkHistory(rt, tc.ops, tc.runs, tc.final, tc.rules)
			got := strings.Join(rt.errs, "\n")
			if tc.want == "" && got != "" {
				t.Errorf("clean history reported:\n%s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("want a complaint containing %q, got:\n%s", tc.want, got)
			}
		})
	}
}

func TestModel(t *testing.T) {
	for _, tc := range []struct {
		stock   int64
		payload string
		next    int64
		out     string
	}{
		{7, "set 3", 3, "ok 3"},
		{3, "restock 2", 5, "ok 5"},
		{1, "buy 1", 0, "sold 0"},
		{0, "buy 1", 0, "soldout 0"},
		{1, "buy 2", 1, "soldout 1"},
		{4, "get", 4, "stock 4"},
	} {
		next, out := model(tc.stock, tc.payload)
		if next != tc.next || out != tc.out {
			t.Errorf("model(%d, %q) = %d, %q; want %d, %q", tc.stock, tc.payload, next, out, tc.next, tc.out)
		}
		if !wellFormed(tc.payload, tc.out) {
			t.Errorf("wellFormed(%q, %q) = false", tc.payload, tc.out)
		}
	}
	for _, bad := range [][2]string{{"buy 1", ""}, {"buy 1", "ok 1"}, {"get", "stock x"}, {"set 1", "sold 1"}} {
		if wellFormed(bad[0], bad[1]) {
			t.Errorf("wellFormed(%q, %q) = true", bad[0], bad[1])
		}
	}
}
