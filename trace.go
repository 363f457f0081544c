package keylane

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// OpenTelemetry tracing, off unless ClientConfig.TracerProvider or
// WorkerConfig.TracerProvider is set. The spans and why they are shaped
// so are written down in doc.go ("Tracing"). Off, every hook below is a
// nil check: no header is written or read, nothing is allocated.
//
// The hooks sit at one call per site: Submit, Call and SubmitMany start a
// send span and inject its context into the job's headers; on the worker,
// the lanes' run function is wrapped (owner.run) so that every task it
// runs carries a jobTrace on its Job, and the places that run a handler
// or reducer (call, reduce), commit a group (applyGroup) and settle a job
// (finish) report to it.

// tracerName is the instrumentation scope of keylane's spans.
const tracerName = "github.com/keylane/keylane"

// Span attributes: the OpenTelemetry messaging conventions (semconv
// v1.37) where they have a name, keylane.* for the rest.
const (
	attrOperationType = attribute.Key("messaging.operation.type")
	attrOperationName = attribute.Key("messaging.operation.name")
	attrDestination   = attribute.Key("messaging.destination.name")
	attrPartitionID   = attribute.Key("messaging.destination.partition.id")
	attrMessageID     = attribute.Key("messaging.message.id")
	attrBodySize      = attribute.Key("messaging.message.body.size")
	attrBatchCount    = attribute.Key("messaging.batch.message_count")
	attrConsumerGroup = attribute.Key("messaging.consumer.group.name")
	attrKey           = attribute.Key("keylane.key")
	attrJobType       = attribute.Key("keylane.job.type")
	attrSeq           = attribute.Key("keylane.seq")
	attrFence         = attribute.Key("keylane.fence")
	attrWorker        = attribute.Key("keylane.worker")
	attrDelivered     = attribute.Key("keylane.delivered")
	attrAttempt       = attribute.Key("keylane.attempt")
	attrAttempts      = attribute.Key("keylane.attempts")
	attrOutcome       = attribute.Key("keylane.outcome")
	attrGroupSize     = attribute.Key("keylane.group.size")
	attrDuplicate     = attribute.Key("keylane.duplicate")
	attrFailed        = attribute.Key("keylane.failed")
	attrError         = attribute.Key("keylane.error")
	attrPermanent     = attribute.Key("keylane.remote.permanent")
	attrDeadLettered  = attribute.Key("keylane.remote.dead_lettered")
)

var attrSystem = attribute.String("messaging.system", "nats")

// Outcomes of a job's process span (keylane.outcome).
const (
	outcomeAcked        = "acked"
	outcomeDeadLettered = "dead_lettered"
	outcomeNotAcked     = "not_acked"
	outcomeRequeued     = "requeued"
)

// Span names on the worker; the process span's name also carries the
// namespace ("keylane.process shop").
const (
	spanQueue  = "keylane.queue"
	spanRun    = "keylane.run"
	spanCommit = "keylane.commit"
)

// headerCarrier adapts a nats.Header to a propagator. NATS header names
// are case-sensitive; W3C Trace Context's are not, so Get falls back to
// a case-insensitive match for producers that capitalise them.
type headerCarrier nats.Header

func (h headerCarrier) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { h[key] = []string{value} }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// setRecorder is a carrier that remembers what it overwrote, so an
// injection that would make a job too large can be undone.
type setRecorder struct {
	h    nats.Header
	prev map[string][]string // key → its earlier values (nil: none)
}

func (s *setRecorder) Get(key string) string { return headerCarrier(s.h).Get(key) }
func (s *setRecorder) Keys() []string        { return headerCarrier(s.h).Keys() }
func (s *setRecorder) Set(key, value string) {
	if _, seen := s.prev[key]; !seen {
		s.prev[key] = s.h[key]
	}
	s.h[key] = []string{value}
}

func (s *setRecorder) undo() {
	for k, v := range s.prev {
		if v == nil {
			delete(s.h, k)
		} else {
			s.h[k] = v
		}
	}
}

func propagatorOr(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p == nil {
		return propagation.TraceContext{}
	}
	return p
}

// clientTracing makes a client's send spans; nil when tracing is off.
type clientTracing struct {
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	nc        *nats.Conn
	namespace string
}

func newClientTracing(cfg ClientConfig, nc *nats.Conn) *clientTracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &clientTracing{
		tracer: cfg.TracerProvider.Tracer(tracerName), prop: propagatorOr(cfg.Propagator),
		nc: nc, namespace: cfg.Namespace,
	}
}

// sendSpan is a producer span of Submit or Call; the zero value (tracing
// off) does nothing.
type sendSpan struct{ span trace.Span }

// send starts the producer span of one job message (op "submit" or
// "call") and writes its context into m's headers.
func (ct *clientTracing) send(ctx context.Context, op string, m *nats.Msg) sendSpan {
	if ct == nil {
		return sendSpan{}
	}
	ctx, span := ct.tracer.Start(ctx, "keylane."+op+" "+ct.namespace,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrSystem, attrOperationType.String("send"), attrOperationName.String(op),
			attrDestination.String(m.Subject), attrPartitionID.String(subjectPartition(m.Subject)),
			attrMessageID.String(m.Header.Get(HeaderJobID)), attrKey.String(m.Header.Get(HeaderKey)),
			attrBodySize.Int(len(m.Data))))
	ct.inject(ctx, span, m)
	return sendSpan{span}
}

// inject writes the span context of ctx into m's headers, unless that
// would take the job past the size Client.message allows (max_payload
// less DeadLetterReserve): then the job goes without it. Tracing never
// makes a job fail.
func (ct *clientTracing) inject(ctx context.Context, span trace.Span, m *nats.Msg) {
	rec := &setRecorder{h: m.Header, prev: map[string][]string{}}
	ct.prop.Inject(ctx, rec)
	if messageSize(m) > ct.nc.MaxPayload()-DeadLetterReserve {
		rec.undo()
		span.AddEvent("keylane.trace_context_dropped", trace.WithAttributes(attrError.String("the job would exceed its size limit with it")))
	}
}

// messageID sets the span's message ID to m's job ID as it was sent.
func (s sendSpan) messageID(m *nats.Msg) {
	if s.span != nil {
		s.span.SetAttributes(attrMessageID.String(m.Header.Get(HeaderJobID)))
	}
}

// end ends the span with the outcome *errp: an error status for any
// error but ErrDuplicate (the job was stored before, by this ID).
func (s sendSpan) end(errp *error) {
	if s.span == nil {
		return
	}
	spanError(s.span, *errp)
	s.span.End()
}

func spanError(span trace.Span, err error) {
	if err == nil {
		return
	}
	if errors.Is(err, ErrDuplicate) {
		span.SetAttributes(attrDuplicate.Bool(true))
		return
	}
	var re *RemoteError
	if errors.As(err, &re) {
		span.SetAttributes(attrPermanent.Bool(re.Permanent), attrDeadLettered.Bool(re.DeadLettered))
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// batchSpan is the one producer span of a SubmitMany; its context goes
// into every job of the batch. The zero value does nothing.
type batchSpan struct {
	ct   *clientTracing
	ctx  context.Context
	span trace.Span
}

func (ct *clientTracing) sendMany(ctx context.Context, n int) batchSpan {
	if ct == nil {
		return batchSpan{}
	}
	ctx, span := ct.tracer.Start(ctx, "keylane.submit_many "+ct.namespace,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrSystem, attrOperationType.String("send"), attrOperationName.String("submit_many"),
			attrBatchCount.Int(n)))
	return batchSpan{ct, ctx, span}
}

func (b batchSpan) inject(m *nats.Msg) {
	if b.span != nil {
		b.ct.inject(b.ctx, b.span, m)
	}
}

// end ends the span, an error if any job of the batch was not stored.
func (b batchSpan) end(out []Submitted) {
	if b.span == nil {
		return
	}
	failed := 0
	var first error
	for _, s := range out {
		if s.Err != nil && !errors.Is(s.Err, ErrDuplicate) {
			if failed++; first == nil {
				first = s.Err
			}
		}
	}
	if failed > 0 {
		b.span.SetAttributes(attrFailed.Int(failed))
		b.span.RecordError(first)
		b.span.SetStatus(codes.Error, first.Error())
	}
	b.span.End()
}

// subjectPartition is the partition token of a job subject
// ("<namespace>.jobs.<p>.<key token>").
func subjectPartition(subject string) string {
	// <ns>.jobs.<partition>.<key token>
	rest := subject[:max(strings.LastIndexByte(subject, '.'), 0)]
	return rest[strings.LastIndexByte(rest, '.')+1:]
}
