package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStagesSplitACall: the report's rest is what the call took beyond
// the worker's two stages, the tracer times the commit, the record and
// the batch apart (and nothing else), and each report starts over.
func TestStagesSplitACall(t *testing.T) {
	t.Setenv("KEYLANE_BENCH_STAGES", "1")
	s := newStages()
	w, c := s.worker(), s.client()
	tr := s.tracer().(*stages)
	ctx := context.Background()
	for range 2 {
		c.Called(10*time.Millisecond, nil)
		w.QueueWait(0, 2*time.Millisecond)
		w.Run(0, 5*time.Millisecond)
		w.Group(0, 3)
		for _, sql := range []string{"commit", "INSERT INTO keylane_outcomes (namespace) VALUES ($1)", "SELECT 1"} {
			tr.TraceQueryEnd(tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: sql}), nil, pgx.TraceQueryEndData{})
		}
		tr.TraceBatchEnd(tr.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{}), nil, pgx.TraceBatchEndData{})
	}
	if s.commit.n.Load() != 2 || s.record.n.Load() != 2 || s.batch.n.Load() != 2 {
		t.Errorf("traced %d commits, %d records, %d batches; want 2 each", s.commit.n.Load(), s.record.n.Load(), s.batch.n.Load())
	}
	// keylanepg's record with COMMIT, one batch, is a commit.
	var rc pgx.Batch
	rc.Queue("INSERT INTO keylane_outcomes (namespace) VALUES ($1)", "ns")
	rc.Queue("commit")
	tr.TraceBatchEnd(tr.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{Batch: &rc}), nil, pgx.TraceBatchEndData{})
	if s.commit.n.Load() != 3 || s.batch.n.Load() != 2 {
		t.Errorf("the record with COMMIT traced as %d commits and %d batches; want 3 and 2", s.commit.n.Load(), s.batch.n.Load())
	}
	var b strings.Builder
	s.report(&b, "row")
	if want := "stages row (means): call 10ms = queued 2ms + run 5ms + rest 3ms; 3.0 jobs per key's group; a transaction: batch "; !strings.HasPrefix(b.String(), want) || !strings.HasSuffix(b.String(), ", 0.7 calls per commit\n") {
		t.Errorf("got %q, want it to start %q and end with 0.7 calls per commit", b.String(), want)
	}
	b.Reset()
	s.report(&b, "row")
	if want := "stages row (means): call 0s = queued 0s + run 0s + rest 0s; 0.0 jobs per key's group; a transaction: batch 0s + record 0s + commit 0s, 0.0 calls per commit\n"; b.String() != want {
		t.Errorf("after a report: got %q, want %q", b.String(), want)
	}
	t.Setenv("KEYLANE_BENCH_STAGES", "")
	if newStages() != nil || newStages().worker() != nil || newStages().client() != nil || newStages().tracer() != nil {
		t.Error("without KEYLANE_BENCH_STAGES: want no observers and no tracer")
	}
}
