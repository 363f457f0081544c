package bench

import (
	"strings"
	"testing"
	"time"
)

// TestStagesSplitACall: the report's rest is what the call took beyond
// the worker's two stages, and it starts over after each report.
func TestStagesSplitACall(t *testing.T) {
	t.Setenv("KEYLANE_BENCH_STAGES", "1")
	s := newStages()
	w, c := s.worker(), s.client()
	for range 2 {
		c.Called(10*time.Millisecond, nil)
		w.QueueWait(0, 2*time.Millisecond)
		w.Run(0, 5*time.Millisecond)
		w.Group(0, 3)
	}
	var b strings.Builder
	s.report(&b, "row")
	if want := "stages row (means): call 10ms = queued 2ms + run 5ms + rest 3ms; 3.0 jobs per key's group\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	s.report(&b, "row")
	if want := "stages row (means): call 0s = queued 0s + run 0s + rest 0s; 0.0 jobs per key's group\n"; b.String() != want {
		t.Errorf("after a report: got %q, want %q", b.String(), want)
	}
	t.Setenv("KEYLANE_BENCH_STAGES", "")
	if newStages() != nil || newStages().worker() != nil || newStages().client() != nil {
		t.Error("without KEYLANE_BENCH_STAGES: want no observers")
	}
}
