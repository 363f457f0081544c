package tenure

import (
	"context"

	"github.com/keylane/keylane/internal/core"

	"github.com/keylane/keylane/internal/tracing"
)

// OpenTelemetry tracing, off unless ClientConfig.TracerProvider or
// WorkerConfig.TracerProvider is set. The spans and why they are shaped
// so are written down in package keylane's doc.go ("Tracing");
// internal/tracing makes them.
// Off, every hook below is a nil check: no header is written or read,
// nothing is allocated.
//
// On the worker the hooks sit at one call per site: the lanes' run
// function is wrapped (Owner.run) so that every task it runs carries a
// jobTrace on its Job, and the places that run a handler or reducer
// (call, reduce), commit a group (applyGroup) and settle a job (finish)
// report to it. The client's hooks are package keylane's tracehooks.go.
//
// The types here are internal/tracing's under the names the tenure calls
// them by, converted at no cost.

// workerTracing makes a worker's spans; nil when tracing is off.
type workerTracing tracing.Worker

// wrap returns run with tracing around it: each task gets a jobTrace for
// this run, and whatever spans a task still has open when run returns
// (the job was left unacked, or put back in its lane to run again) are
// ended there. So no span outlives the run that started it.
func (wt *workerTracing) wrap(run func([]*task)) func([]*task) {
	if wt == nil {
		return run
	}
	return func(ts []*task) {
		for _, t := range ts {
			core.SetTrace(&t.job, (*jobTrace)((*tracing.Worker)(wt).Job(t.msg)))
		}
		run(ts)
		for _, t := range ts {
			traceOf(t.job).leave(t.mark.Requeued())
			core.SetTrace(&t.job, nil)
		}
	}
}

// jobTrace is one job's spans during one run of its lane's runner
// (tracing.JobTrace); nil when tracing is off.
type jobTrace tracing.JobTrace

// traceOf returns the job's spans on this worker, nil when tracing is off.
func traceOf(j core.Job) *jobTrace {
	t, _ := core.Trace(j).(*jobTrace)
	return t
}

// runSpan is one run of a handler or reducer (tracing.RunSpan).
type runSpan tracing.RunSpan

// commitSpan is a job's part of settling (tracing.CommitSpan).
type commitSpan tracing.CommitSpan

func (jt *jobTrace) run(ctx context.Context, job core.Job) (context.Context, runSpan) {
	if jt == nil {
		return ctx, runSpan{}
	}
	ctx, span := (*tracing.JobTrace)(jt).Run(ctx, tracedJob(job))
	return ctx, runSpan(span)
}

func (r runSpan) end(errp *error) { tracing.RunSpan(r).End(errp) }

func (jt *jobTrace) finish(job core.Job, herr error, dead bool) commitSpan {
	if jt == nil {
		return commitSpan{}
	}
	return commitSpan((*tracing.JobTrace)(jt).Finish(tracedJob(job), herr, dead))
}

func (c commitSpan) end(acked *bool) { tracing.CommitSpan(c).End(acked) }

func (jt *jobTrace) leave(requeued bool) { (*tracing.JobTrace)(jt).Leave(requeued) }

// traceGroup records a group commit of jobs (State.group): n of them
// settled, werr the write's error (tracing.Group).
func traceGroup(jobs []core.Job, n int, werr error) {
	if len(jobs) == 0 || traceOf(jobs[0]) == nil || (werr == nil && n == 0) {
		return
	}
	jts := make([]*tracing.JobTrace, len(jobs))
	traced := make([]tracing.Job, len(jobs))
	for i, j := range jobs {
		jts[i], traced[i] = (*tracing.JobTrace)(traceOf(j)), tracedJob(j)
	}
	tracing.Group(jts, traced, n, werr)
}

// tracedJob is what job's spans say about it.
func tracedJob(job core.Job) tracing.Job {
	return tracing.Job{
		ID: job.ID, Key: job.Key, Type: job.Type, Partition: job.Partition,
		Seq: job.Seq, Fence: job.Fence, Attempt: job.Attempt, Size: len(job.Payload),
	}
}
