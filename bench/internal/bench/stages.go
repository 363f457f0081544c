package bench

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane"
)

// stages splits a Call's time by keylane's own observers
// (keylane.WorkerObserver, keylane.ClientObserver), when
// KEYLANE_BENCH_STAGES is set, for the keylane → Postgres rows:
//
//	call     Call's whole duration, as its caller saw it
//	queued   from the jobs stream's store timestamp to the worker taking
//	         the job to run (its key's lane free: a busy key's earlier
//	         group still in its transaction)
//	run      the job's group through the Applier: the wait for the
//	         partition's transaction in flight, then its own
//	rest     call - queued - run: the client's batching, the publish and
//	         the store (the server timestamps a message before it syncs
//	         it), the reply's way back
//
// It prints the means of a run to stderr after the run.
type stages struct {
	calls, callNs   atomic.Int64
	queued, queueNs atomic.Int64
	runs, runNs     atomic.Int64
	groups, jobs    atomic.Int64
}

func newStages() *stages {
	if os.Getenv("KEYLANE_BENCH_STAGES") == "" {
		return nil
	}
	return &stages{}
}

func (s *stages) worker() *keylane.WorkerObserver {
	if s == nil {
		return nil
	}
	return &keylane.WorkerObserver{
		QueueWait: func(_ int, d time.Duration) { s.queued.Add(1); s.queueNs.Add(int64(d)) },
		Run:       func(_ int, d time.Duration) { s.runs.Add(1); s.runNs.Add(int64(d)) },
		Group:     func(_, n int) { s.groups.Add(1); s.jobs.Add(int64(n)) },
	}
}

func (s *stages) client() *keylane.ClientObserver {
	if s == nil {
		return nil
	}
	return &keylane.ClientObserver{Called: func(d time.Duration, _ error) { s.calls.Add(1); s.callNs.Add(int64(d)) }}
}

// report prints the means since the last report, and starts over.
func (s *stages) report(w io.Writer, row string) {
	if s == nil {
		return
	}
	mean := func(n, ns *atomic.Int64) time.Duration {
		c, t := n.Swap(0), ns.Swap(0)
		if c == 0 {
			return 0
		}
		return time.Duration(t / c)
	}
	call, queued, run := mean(&s.calls, &s.callNs), mean(&s.queued, &s.queueNs), mean(&s.runs, &s.runNs)
	g, j := s.groups.Swap(0), s.jobs.Swap(0)
	per := 0.0
	if g > 0 {
		per = float64(j) / float64(g)
	}
	r := time.Microsecond
	fmt.Fprintf(w, "stages %s (means): call %v = queued %v + run %v + rest %v; %.1f jobs per key's group\n",
		row, call.Round(r), queued.Round(r), run.Round(r), (call - queued - run).Round(r), per)
}
