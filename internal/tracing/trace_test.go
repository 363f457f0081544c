package tracing

import (
	"context"
	"errors"
	"testing"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

var errDup = errors.New("duplicate")

func recorded(t *testing.T, fits bool) (*Client, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return NewClient(ClientConfig{
		TracerProvider: tp, Namespace: "shop",
		Fits:      func(*nats.Msg) bool { return fits },
		Duplicate: func(err error) bool { return errors.Is(err, errDup) },
		Remote:    func(error) (bool, bool, bool) { return false, false, false },
	}), rec
}

// TestSendWritesItsContextUnlessTooLarge: a send span's context goes in
// the job's headers, unless the job would then exceed its size limit:
// the headers are left as they were and the span says why.
func TestSendWritesItsContextUnlessTooLarge(t *testing.T) {
	for _, fits := range []bool{true, false} {
		ct, rec := recorded(t, fits)
		m := &nats.Msg{Subject: "shop.jobs.3.k", Header: nats.Header{wire.HeaderJobID: {"a"}, "traceparent": {"old"}}}
		var err error
		ct.Send(context.Background(), "submit", m).End(&err)
		got := m.Header.Get("traceparent")
		if fits == (got == "old") {
			t.Errorf("fits %v: traceparent %q", fits, got)
		}
		s := rec.Ended()
		if len(s) != 1 || s[0].Name() != "keylane.submit shop" {
			t.Fatalf("fits %v: spans %v", fits, s)
		}
		dropped := len(s[0].Events()) == 1 && s[0].Events()[0].Name == "keylane.trace_context_dropped"
		if dropped == fits {
			t.Errorf("fits %v: events %v", fits, s[0].Events())
		}
	}
}

// TestDuplicateIsNoFailure: a send whose job was stored before is not an
// error span, in a batch either; another error is.
func TestDuplicateIsNoFailure(t *testing.T) {
	ct, rec := recorded(t, true)
	err := errDup
	ct.Send(context.Background(), "submit", &nats.Msg{Subject: "shop.jobs.0.k", Header: nats.Header{}}).End(&err)
	errs := []error{nil, errDup, errors.New("refused"), errors.New("again")}
	ct.SendMany(context.Background(), len(errs)).End(len(errs), func(i int) error { return errs[i] })
	s := rec.Ended()
	if len(s) != 2 || s[0].Status().Code == codes.Error || s[1].Status().Code != codes.Error || s[1].Status().Description != "refused" {
		t.Fatalf("spans %v", s)
	}
}

func TestHeaderCarrierGetIgnoresCase(t *testing.T) {
	h := headerCarrier(nats.Header{"Traceparent": {"x"}})
	if h.Get("traceparent") != "x" || h.Get("tracestate") != "" {
		t.Fatalf("Get: %q %q", h.Get("traceparent"), h.Get("tracestate"))
	}
}

func TestSubjectPartition(t *testing.T) {
	if p := subjectPartition("shop.jobs.12.sku_1"); p != "12" {
		t.Fatalf("subjectPartition = %q, want 12", p)
	}
}

// TestOffIsANilCheck: with tracing off every hook is a nil check.
func TestOffIsANilCheck(t *testing.T) {
	var ct *Client
	var wt *Worker
	m := &nats.Msg{Subject: "shop.jobs.0.k", Header: nats.Header{}}
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		acked := true
		ct.Send(context.Background(), "call", m).End(&err)
		b := ct.SendMany(context.Background(), 1)
		b.Inject(m)
		b.End(0, nil)
		jt := wt.Job(nil)
		_, r := jt.Run(context.Background(), Job{})
		r.End(&err)
		jt.Finish(Job{}, nil, false).End(&acked)
		jt.Leave(false)
		Group([]*JobTrace{jt}, []Job{{}}, 1, nil)
	})
	if allocs != 0 || len(m.Header) != 0 {
		t.Fatalf("tracing off: %v allocations, headers %v", allocs, m.Header)
	}
}
