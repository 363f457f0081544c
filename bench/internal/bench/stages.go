package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

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
// and, as a pgx tracer on the workers' pool, a transaction's round trips:
// the batch (BEGIN, the fence, the outcomes look-up and the jobs'
// statements) and the COMMIT, with the record INSERT in it on a pool
// (keylanepg's fast path) or apart (record).
//
// It prints the means of a run to stderr after the run.
type stages struct {
	calls, callNs   atomic.Int64
	queued, queueNs atomic.Int64
	runs, runNs     atomic.Int64
	groups, jobs    atomic.Int64

	batch, record, commit stage
}

// stage sums the durations of one kind of round trip.
type stage struct{ n, ns atomic.Int64 }

func (s *stage) add(d time.Duration) { s.n.Add(1); s.ns.Add(int64(d)) }

// mean is the mean since the last call, which starts over.
func (s *stage) mean() time.Duration {
	n, ns := s.n.Swap(0), s.ns.Swap(0)
	if n == 0 {
		return 0
	}
	return time.Duration(ns / n)
}

type stageStart struct {
	at   time.Time
	what *stage
}

type stageKey struct{}

// TraceQueryStart times the record INSERT and the COMMIT.
func (s *stages) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	var what *stage
	switch sql := strings.TrimSpace(d.SQL); {
	case strings.EqualFold(sql, "commit"):
		what = &s.commit
	case strings.HasPrefix(sql, "INSERT INTO keylane_outcomes"):
		what = &s.record
	default:
		return ctx
	}
	return context.WithValue(ctx, stageKey{}, stageStart{time.Now(), what})
}

func (s *stages) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if st, ok := ctx.Value(stageKey{}).(stageStart); ok {
		st.what.add(time.Since(st.at))
	}
}

// TraceBatchStart times a batch, from its send to its Close: the
// transaction's first, or (on a pool) its record with COMMIT, or its
// COMMIT alone.
func (s *stages) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	what := &s.batch
	if d.Batch != nil && len(d.Batch.QueuedQueries) > 0 {
		if q := d.Batch.QueuedQueries[len(d.Batch.QueuedQueries)-1]; strings.EqualFold(strings.TrimSpace(q.SQL), "commit") {
			what = &s.commit
		}
	}
	return context.WithValue(ctx, stageKey{}, stageStart{time.Now(), what})
}

func (s *stages) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (s *stages) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if st, ok := ctx.Value(stageKey{}).(stageStart); ok {
		st.what.add(time.Since(st.at))
	}
}

// tracer is s as the pool's tracer, or nil.
func (s *stages) tracer() pgx.QueryTracer {
	if s == nil {
		return nil
	}
	return s
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

// reset starts over.
func (s *stages) reset() {
	if s != nil {
		s.report(io.Discard, "")
	}
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
	commits := s.commit.n.Load()
	calls := s.calls.Load()
	call, queued, run := mean(&s.calls, &s.callNs), mean(&s.queued, &s.queueNs), mean(&s.runs, &s.runNs)
	g, j := s.groups.Swap(0), s.jobs.Swap(0)
	per := 0.0
	if g > 0 {
		per = float64(j) / float64(g)
	}
	r := time.Microsecond
	perTx := 0.0
	if commits > 0 {
		perTx = float64(calls) / float64(commits)
	}
	fmt.Fprintf(w, "stages %s (means): call %v = queued %v + run %v + rest %v; %.1f jobs per key's group; a transaction: batch %v + record %v + commit %v, %.1f calls per commit\n",
		row, call.Round(r), queued.Round(r), run.Round(r), (call - queued - run).Round(r), per,
		s.batch.mean().Round(r), s.record.mean().Round(r), s.commit.mean().Round(r), perTx)
}
