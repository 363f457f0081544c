package tenure

import (
	"context"
	"log/slog"
	"time"

	"github.com/keylane/keylane/internal/core"
)

// Per-job events at DEBUG: one line each when a job is received (its
// key, stream sequence and delivery count), ran (attempt, duration, and
// the error if it failed), committed (a reducer's group write, with the
// group's size) and acked. Retries and dead letters log at WARN already.
// The owner's logger carries the partition and the fence.
//
// Every helper first asks the logger whether DEBUG is on, before it
// builds an attribute or reads the clock: at INFO a job pays one Enabled
// call per event and allocates nothing (TestJobLogFreeAtInfo).

// debugJobs reports whether per-job events are logged.
func (o *Owner) debugJobs() bool {
	return o.log.Enabled(context.Background(), slog.LevelDebug)
}

// logReceived logs a job queued in its key's lane.
func (o *Owner) logReceived(t *task, delivered uint64) {
	if !o.debugJobs() {
		return
	}
	o.log.LogAttrs(context.Background(), slog.LevelDebug, "job received",
		slog.String("job_id", t.job.ID), slog.String("key", t.job.Key), slog.Uint64("seq", t.job.Seq),
		slog.Uint64("delivered", delivered), slog.Bool("maybe_dup", t.maybeDup))
}

// jobClock starts timing a run: the zero time when per-job events are
// off, so the clock is not even read.
func (o *Owner) jobClock() time.Time {
	if !o.debugJobs() {
		return time.Time{}
	}
	return time.Now()
}

// logRan logs a handler or reducer run that started at start (jobClock).
func (o *Owner) logRan(job *core.Job, start time.Time, err error) {
	if start.IsZero() {
		return
	}
	attrs := [...]slog.Attr{
		slog.String("job_id", job.ID), slog.String("key", job.Key), slog.Uint64("seq", job.Seq),
		slog.Int("attempt", job.Attempt), slog.Duration("took", time.Since(start)), {},
	}
	n := len(attrs) - 1
	if err != nil {
		attrs[n] = slog.Any("err", err)
		n++
	}
	o.log.LogAttrs(context.Background(), slog.LevelDebug, "job ran", attrs[:n]...)
}

// logCommitted logs the state write of jobs, a group of one key.
func (o *Owner) logCommitted(jobs []core.Job) {
	if len(jobs) == 0 || !o.debugJobs() {
		return
	}
	o.log.LogAttrs(context.Background(), slog.LevelDebug, "jobs committed",
		slog.String("key", jobs[0].Key), slog.Int("group", len(jobs)),
		slog.Uint64("first_seq", jobs[0].Seq), slog.Uint64("last_seq", jobs[len(jobs)-1].Seq))
}

// logAcked logs a job acked: it leaves the stream.
func (o *Owner) logAcked(t *task) {
	if !o.debugJobs() {
		return
	}
	o.log.LogAttrs(context.Background(), slog.LevelDebug, "job acked",
		slog.String("job_id", t.job.ID), slog.String("key", t.job.Key), slog.Uint64("seq", t.job.Seq))
}
