package keylane

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The worker's half of tracing: a job's process, queue, run and commit
// spans (doc.go, "Tracing"); trace.go has the client's and what both share.

// workerTracing makes a worker's spans; nil when tracing is off.
type workerTracing struct {
	tracer  trace.Tracer
	prop    propagation.TextMapPropagator
	worker  string
	process string // the process span's name
}

func newWorkerTracing(cfg WorkerConfig) *workerTracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &workerTracing{
		tracer: cfg.TracerProvider.Tracer(tracerName), prop: propagatorOr(cfg.Propagator),
		worker: cfg.ID, process: "keylane.process " + cfg.Topology.Namespace,
	}
}

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
			t.job.trace = &jobTrace{wt: wt, msg: t.msg}
		}
		run(ts)
		for _, t := range ts {
			t.job.trace.leave(t.mark.Requeued())
			t.job.trace = nil
		}
	}
}

// jobTrace is one job's spans during one run of its lane's runner. The
// process span begins the first time the job runs or is settled; only the
// runner goroutine touches it.
type jobTrace struct {
	wt       *workerTracing
	msg      jetstream.Msg
	ctx      context.Context // carries the process span
	span     trace.Span      // the process span; nil until begun
	lastRun  time.Time       // when its last run span ended
	commit   *groupCommit    // the commit span covering it, if a group's
	released bool            // its part of commit is over
	ended    bool
}

// groupCommit is one commit span shared by the jobs of a group; it ends
// when the last of them is settled or left.
type groupCommit struct {
	span trace.Span
	open int
}

// begin starts the process span, from the job's stream timestamp, with
// the context its producer sent as parent (none, or one that does not
// parse, makes it a root span), and records the queue wait as a child.
func (jt *jobTrace) begin(job Job) {
	if jt.span != nil {
		return
	}
	now := time.Now()
	start, delivered := now, uint64(0)
	if meta, err := jt.msg.Metadata(); err == nil {
		delivered = meta.NumDelivered
		if meta.Timestamp.Before(now) {
			start = meta.Timestamp
		}
	}
	parent := jt.wt.prop.Extract(context.Background(), headerCarrier(jt.msg.Headers()))
	attrs := []attribute.KeyValue{
		attrSystem, attrOperationType.String("process"), attrOperationName.String("process"),
		attrDestination.String(jt.msg.Subject()), attrPartitionID.Int(job.Partition),
		attrConsumerGroup.String(Names{}.Consumer(job.Partition)),
		attrMessageID.String(job.ID), attrKey.String(job.Key), attrBodySize.Int(len(job.Payload)),
		attrSeq.Int64(int64(job.Seq)), attrFence.Int64(int64(job.Fence)), attrWorker.String(jt.wt.worker),
		attrDelivered.Int64(int64(delivered)),
	}
	if job.Type != "" {
		attrs = append(attrs, attrJobType.String(job.Type))
	}
	jt.ctx, jt.span = jt.wt.tracer.Start(parent, jt.wt.process,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	_, q := jt.wt.tracer.Start(jt.ctx, spanQueue, trace.WithTimestamp(start), trace.WithAttributes(attrDelivered.Int64(int64(delivered))))
	q.End(trace.WithTimestamp(now))
}

// runSpan is one run of a handler or reducer; the zero value does nothing.
type runSpan struct {
	jt      *jobTrace
	span    trace.Span
	attempt int
}

// run starts the run span of job's current attempt and returns ctx
// carrying it, for the handler or reducer: their own spans nest under it.
func (jt *jobTrace) run(ctx context.Context, job Job) (context.Context, runSpan) {
	if jt == nil {
		return ctx, runSpan{}
	}
	jt.begin(job)
	_, span := jt.wt.tracer.Start(jt.ctx, spanRun, trace.WithAttributes(attrAttempt.Int(job.Attempt)))
	return trace.ContextWithSpan(ctx, span), runSpan{jt, span, job.Attempt}
}

// end ends the run with its outcome *errp; a failed run is also an event
// on the process span, so retries show there.
func (r runSpan) end(errp *error) {
	if r.span == nil {
		return
	}
	now := time.Now()
	if err := *errp; err != nil {
		r.span.RecordError(err, trace.WithTimestamp(now))
		r.span.SetStatus(codes.Error, err.Error())
		r.jt.span.AddEvent("keylane.attempt_failed", trace.WithTimestamp(now),
			trace.WithAttributes(attrAttempt.Int(r.attempt), attrError.String(err.Error())))
	}
	r.span.End(trace.WithTimestamp(now))
	r.jt.lastRun = now
}

// traceGroup records a group commit of jobs (State.group): n of them
// settled, werr the write's error. One commit span covers the group, from
// the end of its last run until the last of its jobs is acked; its
// parent is the group's last settled job (the one whose sequence the
// write records), and it links to the others, each of which links back
// to it. A failed write is a commit span with an error status at once.
func traceGroup(jobs []Job, n int, werr error) {
	if len(jobs) == 0 || jobs[0].trace == nil || (werr == nil && n == 0) {
		return
	}
	start := time.Time{}
	for _, j := range jobs {
		if j.trace.lastRun.After(start) {
			start = j.trace.lastRun
		}
	}
	if start.IsZero() {
		start = time.Now()
	}
	covered := jobs[:n]
	if werr != nil {
		// The write covered the jobs that ran.
		covered = nil
		for _, j := range jobs {
			if j.trace.span != nil {
				covered = append(covered, j)
			}
		}
		if len(covered) == 0 {
			covered = jobs[:1]
		}
	}
	last := covered[len(covered)-1]
	var links []trace.Link
	for _, j := range covered {
		j.trace.begin(j)
		if j.trace != last.trace {
			links = append(links, trace.Link{SpanContext: j.trace.span.SpanContext()})
		}
	}
	_, span := last.trace.wt.tracer.Start(last.trace.ctx, spanCommit, trace.WithTimestamp(start),
		trace.WithLinks(links...), trace.WithAttributes(attrGroupSize.Int(len(covered))))
	if werr != nil {
		span.RecordError(werr)
		span.SetStatus(codes.Error, werr.Error())
		span.End()
		return
	}
	g := &groupCommit{span: span, open: len(covered)}
	for _, j := range covered {
		j.trace.releaseCommit() // an earlier commit's part, if any
		j.trace.commit, j.trace.released = g, false
		if j.trace != last.trace {
			j.trace.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
		}
	}
}

func (jt *jobTrace) releaseCommit() {
	if jt.commit == nil || jt.released {
		return
	}
	jt.released = true
	if jt.commit.open--; jt.commit.open == 0 {
		jt.commit.span.End()
	}
}

// commitSpan is a job's part of settling (finish: keep the outcome,
// reply, ack); the zero value does nothing.
type commitSpan struct {
	jt   *jobTrace
	job  Job
	span trace.Span // its own commit span; nil when a group's covers it
	herr error
	dead bool
}

// finish starts the commit part of settling job with outcome herr (dead:
// it was dead-lettered). A Handler job gets a commit span of its own; a
// Reducer job's is its group's.
func (jt *jobTrace) finish(job Job, herr error, dead bool) commitSpan {
	if jt == nil {
		return commitSpan{}
	}
	jt.begin(job)
	c := commitSpan{jt: jt, job: job, herr: herr, dead: dead}
	if jt.commit == nil || jt.released {
		_, c.span = jt.wt.tracer.Start(jt.ctx, spanCommit, trace.WithAttributes(attrGroupSize.Int(1)))
	}
	return c
}

// end ends the commit part and the process span: acked, dead-lettered, or
// not acked (the lease was no longer trusted: the job will be delivered
// again).
func (c commitSpan) end(acked *bool) {
	if c.jt == nil {
		return
	}
	if c.span != nil {
		if !*acked {
			c.span.SetStatus(codes.Error, "not acked")
		}
		c.span.End()
	} else {
		c.jt.releaseCommit()
	}
	jt := c.jt
	if jt.ended {
		return
	}
	jt.ended = true
	jt.span.SetAttributes(attrAttempts.Int(c.job.Attempt))
	switch {
	case !*acked:
		jt.span.SetAttributes(attrOutcome.String(outcomeNotAcked))
		jt.span.SetStatus(codes.Error, "not acked: the job will be delivered again")
	case c.dead:
		jt.span.SetAttributes(attrOutcome.String(outcomeDeadLettered))
		jt.span.AddEvent("keylane.dead_lettered", trace.WithAttributes(attrAttempts.Int(c.job.Attempt), attrError.String(c.herr.Error())))
		jt.span.SetStatus(codes.Error, c.herr.Error())
	default:
		jt.span.SetAttributes(attrOutcome.String(outcomeAcked))
		if c.herr != nil {
			// An outcome kept from an earlier run, which failed.
			jt.span.SetStatus(codes.Error, c.herr.Error())
		}
	}
	jt.span.End()
}

// leave ends what the run left open: the job's part of a group commit,
// and its process span if it was not settled (left unacked, or requeued
// to run again in a later run, which starts a new process span).
func (jt *jobTrace) leave(requeued bool) {
	jt.releaseCommit()
	if jt.span == nil || jt.ended {
		return
	}
	jt.ended = true
	if requeued {
		jt.span.SetAttributes(attrOutcome.String(outcomeRequeued))
	} else {
		jt.span.SetAttributes(attrOutcome.String(outcomeNotAcked))
		jt.span.SetStatus(codes.Error, "not acked: the job will be delivered again")
	}
	jt.span.End()
}
