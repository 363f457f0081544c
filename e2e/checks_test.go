package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keylane/keylane/internal/sale"
)

// TestCheckTraceCatches feeds checkTrace traces that break each rule and
// checks that it complains: the end-to-end tests are only as good as it.
func TestCheckTraceCatches(t *testing.T) {
	run := func(w, job, key string, seq, fence uint64, start, end int64, applied bool) sale.Span {
		return sale.Span{Worker: w, Job: job, Key: key, Seq: seq, Fence: fence, Start: start, End: end, Applied: applied}
	}
	ps := []purchase{{id: "a"}, {id: "b"}}
	for _, tc := range []struct {
		name  string
		runs  []sale.Span
		rules traceRules
		want  string // "" for a clean trace
	}{
		{"clean", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true), run("w0", "b", "k", 2, 5, 10, 20, true)}, traceRules{once: true}, ""},
		{"overlap", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true), run("w1", "b", "k", 2, 5, 9, 20, true)}, traceRules{}, "overlaps"},
		{"applied twice", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true), run("w1", "a", "k", 1, 6, 10, 20, true), run("w1", "b", "k", 2, 6, 20, 30, true)}, traceRules{}, "applied 2 times"},
		{"ran twice", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true), run("w1", "a", "k", 1, 6, 10, 20, false), run("w1", "b", "k", 2, 6, 20, 30, true)}, traceRules{once: true}, "ran 2 times"},
		{"out of order", []sale.Span{run("w0", "b", "k", 2, 5, 0, 10, true), run("w0", "a", "k", 1, 5, 10, 20, true)}, traceRules{}, "applied after"},
		{"stale fence wrote last", []sale.Span{run("w1", "a", "k", 1, 6, 0, 10, true), run("w0", "b", "k", 2, 5, 10, 20, true)}, traceRules{}, "fence 5 after"},
		{"never ran", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true)}, traceRules{}, "b never ran"},
		{"not applied", []sale.Span{run("w0", "a", "k", 1, 5, 0, 10, true), run("w0", "b", "k", 2, 5, 10, 20, false)}, traceRules{}, "no applied run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &recordingT{}
			checkTrace(rt, tc.runs, ps, tc.rules)
			got := strings.Join(rt.errs, "\n")
			if tc.want == "" && got != "" {
				t.Errorf("clean trace reported:\n%s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("want a complaint containing %q, got:\n%s", tc.want, got)
			}
		})
	}
}

// recordingT is a reporter that collects the failures a checker reports,
// so the checkers themselves can be tested.
type recordingT struct{ errs []string }

func (r *recordingT) Helper() {}
func (r *recordingT) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

// TestCheckTraceExcusesAnUnansweredWrite: a run whose state write was
// sent and never answered (Unknown: the worker's lease trust ended under
// it) may have landed; its job answered later from the held outcome has
// no applied run, and with a good reply that is not a failure (the stock
// check vouches for exactly-once). In a loaded run TestPausedWorkerBatches
// failed so on a worker that was not the paused one: "purchase pause-122
// has no applied run: [{Worker:e2e-pause-batches-w0 … Applied:false}]",
// its log saying "group commit failed; … context canceled". Without a
// reply, or without Unknown, it still fails.
func TestCheckTraceExcusesAnUnansweredWrite(t *testing.T) {
	span := sale.Span{Worker: "w0", Job: "a", Key: "k", Seq: 1, Fence: 5, Start: 0, End: 10, Unknown: true}
	for _, tc := range []struct {
		name    string
		unknown bool
		reply   string
		want    string
	}{
		{"unknown, answered", true, "sold 9", ""},
		{"unknown, no reply", true, "", "no applied run"},
		{"refused, answered", false, "sold 9", "no applied run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := span
			s.Unknown = tc.unknown
			rt := &recordingT{}
			checkTrace(rt, []sale.Span{s}, []purchase{{id: "a", reply: tc.reply}}, traceRules{})
			got := strings.Join(rt.errs, "\n")
			if tc.want == "" && got != "" {
				t.Errorf("reported:\n%s", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("want a complaint containing %q, got:\n%s", tc.want, got)
			}
		})
	}
}
