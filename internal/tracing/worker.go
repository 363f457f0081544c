package tracing

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
// spans (doc.go); trace.go has the client's and what both share.

// WorkerConfig is what NewWorker builds a worker's tracing from.
type WorkerConfig struct {
	// TracerProvider makes the spans; nil turns tracing off.
	TracerProvider trace.TracerProvider
	// Propagator reads a job's parent span context from its headers.
	// Defaults to W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// Worker is the worker's ID (keylane.worker).
	Worker string
	// Namespace names the process spans ("keylane.process <namespace>").
	Namespace string
	// Consumer names a partition's consumer
	// (messaging.consumer.group.name).
	Consumer func(partition int) string
}

// Worker makes a worker's spans; nil when tracing is off, and then every
// method is a nil check. It is safe for concurrent use.
type Worker struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	worker   string
	process  string // the process span's name
	consumer func(partition int) string
}

// NewWorker returns a worker's tracing, or nil when cfg.TracerProvider is
// nil (tracing off).
func NewWorker(cfg WorkerConfig) *Worker {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &Worker{
		tracer: cfg.TracerProvider.Tracer(TracerName), prop: propagatorOr(cfg.Propagator),
		worker: cfg.Worker, process: "keylane.process " + cfg.Namespace, consumer: cfg.Consumer,
	}
}

// Job is what a job's spans say about it: the worker's Job, less what
// tracing does not read.
type Job struct {
	ID, Key, Type string
	Partition     int
	Seq, Fence    uint64
	Attempt       int
	Size          int // the payload's bytes
}

// Job returns the spans of one job, fetched as msg, for one run of its
// lane's runner; nil when wt is nil. Leave ends what that run left open.
func (wt *Worker) Job(msg jetstream.Msg) *JobTrace {
	if wt == nil {
		return nil
	}
	return &JobTrace{wt: wt, msg: msg}
}

// JobTrace is one job's spans during one run of its lane's runner. The
// process span begins the first time the job runs or is settled; only the
// runner goroutine touches it. A nil *JobTrace (tracing off) does
// nothing.
type JobTrace struct {
	wt       *Worker
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
func (jt *JobTrace) begin(job Job) {
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
		attrConsumerGroup.String(jt.wt.consumer(job.Partition)),
		attrMessageID.String(job.ID), attrKey.String(job.Key), attrBodySize.Int(job.Size),
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

// RunSpan is one run of a handler or reducer; the zero value does nothing.
type RunSpan struct {
	jt      *JobTrace
	span    trace.Span
	attempt int
}

// Run starts the run span of job's current attempt and returns ctx
// carrying it, for the handler or reducer: their own spans nest under it.
func (jt *JobTrace) Run(ctx context.Context, job Job) (context.Context, RunSpan) {
	if jt == nil {
		return ctx, RunSpan{}
	}
	jt.begin(job)
	_, span := jt.wt.tracer.Start(jt.ctx, spanRun, trace.WithAttributes(attrAttempt.Int(job.Attempt)))
	return trace.ContextWithSpan(ctx, span), RunSpan{jt, span, job.Attempt}
}

// End ends the run with its outcome *errp; a failed run is also an event
// on the process span, so retries show there.
func (r RunSpan) End(errp *error) {
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

// Group records a group commit of jobs (State.group), each with its
// spans (jts[i] is jobs[i]'s): n of them settled, werr the write's error.
// One commit span covers the group, from the end of its last run until the
// last of its jobs is acked; its parent is the group's last settled job
// (the one whose sequence the write records), and it links to the others,
// each of which links back to it. A failed write is a commit span with an
// error status at once.
func Group(jts []*JobTrace, jobs []Job, n int, werr error) {
	if len(jts) == 0 || jts[0] == nil || (werr == nil && n == 0) {
		return
	}
	start := time.Time{}
	for _, jt := range jts {
		if jt.lastRun.After(start) {
			start = jt.lastRun
		}
	}
	if start.IsZero() {
		start = time.Now()
	}
	covered := make([]int, 0, len(jts)) // indices of the jobs the write covered
	for i := range n {
		covered = append(covered, i)
	}
	if werr != nil {
		// The write covered the jobs that ran.
		covered = covered[:0]
		for i, jt := range jts {
			if jt.span != nil {
				covered = append(covered, i)
			}
		}
		if len(covered) == 0 {
			covered = append(covered, 0)
		}
	}
	last := jts[covered[len(covered)-1]]
	var links []trace.Link
	for _, i := range covered {
		jts[i].begin(jobs[i])
		if jts[i] != last {
			links = append(links, trace.Link{SpanContext: jts[i].span.SpanContext()})
		}
	}
	_, span := last.wt.tracer.Start(last.ctx, spanCommit, trace.WithTimestamp(start),
		trace.WithLinks(links...), trace.WithAttributes(attrGroupSize.Int(len(covered))))
	if werr != nil {
		span.RecordError(werr)
		span.SetStatus(codes.Error, werr.Error())
		span.End()
		return
	}
	g := &groupCommit{span: span, open: len(covered)}
	for _, i := range covered {
		jt := jts[i]
		jt.releaseCommit() // an earlier commit's part, if any
		jt.commit, jt.released = g, false
		if jt != last {
			jt.span.AddLink(trace.Link{SpanContext: span.SpanContext()})
		}
	}
}

func (jt *JobTrace) releaseCommit() {
	if jt.commit == nil || jt.released {
		return
	}
	jt.released = true
	if jt.commit.open--; jt.commit.open == 0 {
		jt.commit.span.End()
	}
}

// CommitSpan is a job's part of settling (finish: keep the outcome,
// reply, ack); the zero value does nothing.
type CommitSpan struct {
	jt   *JobTrace
	job  Job
	span trace.Span // its own commit span; nil when a group's covers it
	herr error
	dead bool
}

// Finish starts the commit part of settling job with outcome herr (dead:
// it was dead-lettered). A Handler job gets a commit span of its own; a
// Reducer job's is its group's.
func (jt *JobTrace) Finish(job Job, herr error, dead bool) CommitSpan {
	if jt == nil {
		return CommitSpan{}
	}
	jt.begin(job)
	c := CommitSpan{jt: jt, job: job, herr: herr, dead: dead}
	if jt.commit == nil || jt.released {
		_, c.span = jt.wt.tracer.Start(jt.ctx, spanCommit, trace.WithAttributes(attrGroupSize.Int(1)))
	}
	return c
}

// End ends the commit part and the process span: acked, dead-lettered, or
// not acked (the lease was no longer trusted: the job will be delivered
// again).
func (c CommitSpan) End(acked *bool) {
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

// Leave ends what the run left open: the job's part of a group commit,
// and its process span if it was not settled (left unacked, or requeued
// to run again in a later run, which starts a new process span).
func (jt *JobTrace) Leave(requeued bool) {
	if jt == nil {
		return
	}
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
