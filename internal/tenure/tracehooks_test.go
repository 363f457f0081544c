package tenure

import (
	"context"
	"testing"

	"github.com/keylane/keylane/internal/core"
)

// TestTracingOffAllocatesNothing: with tracing off every hook of the
// tenure is a nil check (the client's: package keylane's test of the
// name).
func TestTracingOffAllocatesNothing(t *testing.T) {
	var wt *workerTracing
	job := core.Job{ID: "a", Key: "k"}
	jobs := []core.Job{job}
	run := func([]*task) {}
	c := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		acked := true
		_, span := traceOf(job).run(c, job)
		span.end(&err)
		traceGroup(jobs, 1, nil)
		traceOf(job).finish(job, nil, false).end(&acked)
		_ = wt.wrap(run)
	})
	if allocs != 0 {
		t.Fatalf("tracing off allocates %v times per job", allocs)
	}
}
