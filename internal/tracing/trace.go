package tracing

import (
	"context"
	"strings"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// What the client's and the worker's spans share, and the client's send
// spans; worker.go has the worker's.

// TracerName is the instrumentation scope of keylane's spans.
const TracerName = "github.com/keylane/keylane"

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

// ClientConfig is what NewClient builds a client's tracing from.
type ClientConfig struct {
	// TracerProvider makes the spans; nil turns tracing off.
	TracerProvider trace.TracerProvider
	// Propagator writes a span's context into a job's headers. Defaults
	// to W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// Namespace names the spans ("keylane.submit <namespace>").
	Namespace string
	// Fits reports whether a job message is within its size limit (the
	// client's: max_payload less DeadLetterReserve). A trace context that
	// would take a job past it is left out.
	Fits func(m *nats.Msg) bool
	// Duplicate reports whether a send's error only says a job with its
	// ID was stored before: not a failure (ErrDuplicate).
	Duplicate func(err error) bool
	// Remote reports whether a send's error is the worker's answer that
	// the job failed (a RemoteError), and whether that was permanent and
	// dead-lettered.
	Remote func(err error) (permanent, deadLettered, ok bool)
}

// Client makes a client's send spans; nil when tracing is off, and then
// every method is a nil check. It is safe for concurrent use.
type Client struct {
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	namespace string
	fits      func(*nats.Msg) bool
	duplicate func(error) bool
	remote    func(error) (permanent, deadLettered, ok bool)
}

// NewClient returns a client's tracing, or nil when cfg.TracerProvider is
// nil (tracing off).
func NewClient(cfg ClientConfig) *Client {
	if cfg.TracerProvider == nil {
		return nil
	}
	return &Client{
		tracer: cfg.TracerProvider.Tracer(TracerName), prop: propagatorOr(cfg.Propagator),
		namespace: cfg.Namespace, fits: cfg.Fits, duplicate: cfg.Duplicate, remote: cfg.Remote,
	}
}

// SendSpan is a producer span of Submit or Call; the zero value (tracing
// off) does nothing.
type SendSpan struct {
	span trace.Span
	ct   *Client
}

// Send starts the producer span of one job message (op "submit" or
// "call") and writes its context into m's headers.
func (ct *Client) Send(ctx context.Context, op string, m *nats.Msg) SendSpan {
	if ct == nil {
		return SendSpan{}
	}
	ctx, span := ct.tracer.Start(ctx, "keylane."+op+" "+ct.namespace,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrSystem, attrOperationType.String("send"), attrOperationName.String(op),
			attrDestination.String(m.Subject), attrPartitionID.String(subjectPartition(m.Subject)),
			attrMessageID.String(m.Header.Get(wire.HeaderJobID)), attrKey.String(m.Header.Get(wire.HeaderKey)),
			attrBodySize.Int(len(m.Data))))
	ct.inject(ctx, span, m)
	return SendSpan{span, ct}
}

// inject writes the span context of ctx into m's headers, unless that
// would take the job past its size limit (ClientConfig.Fits): then the
// job goes without it. Tracing never makes a job fail.
func (ct *Client) inject(ctx context.Context, span trace.Span, m *nats.Msg) {
	rec := &setRecorder{h: m.Header, prev: map[string][]string{}}
	ct.prop.Inject(ctx, rec)
	if !ct.fits(m) {
		rec.undo()
		span.AddEvent("keylane.trace_context_dropped", trace.WithAttributes(attrError.String("the job would exceed its size limit with it")))
	}
}

// MessageID sets the span's message ID to m's job ID as it was sent.
func (s SendSpan) MessageID(m *nats.Msg) {
	if s.span != nil {
		s.span.SetAttributes(attrMessageID.String(m.Header.Get(wire.HeaderJobID)))
	}
}

// End ends the span with the outcome *errp: an error status for any
// error but a duplicate (the job was stored before, by this ID).
func (s SendSpan) End(errp *error) {
	if s.span == nil {
		return
	}
	s.ct.spanError(s.span, *errp)
	s.span.End()
}

func (ct *Client) spanError(span trace.Span, err error) {
	if err == nil {
		return
	}
	if ct.duplicate(err) {
		span.SetAttributes(attrDuplicate.Bool(true))
		return
	}
	if permanent, deadLettered, ok := ct.remote(err); ok {
		span.SetAttributes(attrPermanent.Bool(permanent), attrDeadLettered.Bool(deadLettered))
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// BatchSpan is the one producer span of a SubmitMany; its context goes
// into every job of the batch. The zero value does nothing.
type BatchSpan struct {
	ct   *Client
	ctx  context.Context
	span trace.Span
}

// SendMany starts the producer span of a SubmitMany of n jobs.
func (ct *Client) SendMany(ctx context.Context, n int) BatchSpan {
	if ct == nil {
		return BatchSpan{}
	}
	ctx, span := ct.tracer.Start(ctx, "keylane.submit_many "+ct.namespace,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrSystem, attrOperationType.String("send"), attrOperationName.String("submit_many"),
			attrBatchCount.Int(n)))
	return BatchSpan{ct, ctx, span}
}

// Inject writes the batch span's context into m's headers (see inject).
func (b BatchSpan) Inject(m *nats.Msg) {
	if b.span != nil {
		b.ct.inject(b.ctx, b.span, m)
	}
}

// End ends the span, an error if any job of the batch was not stored:
// errOf(i) is the i-th of its n jobs' outcome.
func (b BatchSpan) End(n int, errOf func(i int) error) {
	if b.span == nil {
		return
	}
	failed := 0
	var first error
	for i := range n {
		if err := errOf(i); err != nil && !b.ct.duplicate(err) {
			if failed++; first == nil {
				first = err
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
