package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/otlptest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/internal/workercmd"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// TestOTLPEndpoint: a worker command and a submit call, both run with
// --otlp-endpoint pointing at an in-process OTLP/HTTP receiver, export
// the job's spans there: the call's producer span (service
// keylane-submit), and the worker's process span (service
// keylane-worker) in the same trace as its child, with its run span
// under it. The submit's spans are sent before it returns; the worker's
// by the time it has stopped. A bad endpoint is refused as a usage
// error, before anything connects.
func TestOTLPEndpoint(t *testing.T) {
	srv := natstest.Start(t)
	recv := otlptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := workercmd.Parse(flag.NewFlagSet("worker", flag.ContinueOnError), []string{
		"--nats", srv.ClientURL(), "--namespace", "traced", "--partitions", "2", "--id", "w1", "--log-level", "error",
		"--otlp-endpoint", recv.URL,
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.OTLPEndpoint != recv.URL {
		t.Fatalf("OTLPEndpoint %q", c.OTLPEndpoint)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- workercmd.Run(wctx, c, nil) }()
	var workerErr error
	stopped := false
	stop := func() error {
		if !stopped {
			stopWorker()
			workerErr, stopped = <-done, true
		}
		return workerErr
	}
	defer stop()
	var out bytes.Buffer
	testwait.Eventually(t, 20*time.Second, "the call is answered", func() bool {
		out.Reset()
		return run(ctx, []string{"call", "--nats", srv.ClientURL(), "--namespace", "traced", "--key", "sku:1", "--payload", "restock 5", "--id", "restock-1", "--timeout", "5s",
			"--otlp-endpoint", recv.URL}, &out, io.Discard) == nil
	})
	var call *otlptest.Span
	for _, s := range recv.Spans() {
		if s.Name == "keylane.call traced" && s.Attrs["messaging.message.id"] == "restock-1" {
			call = &s
		}
	}
	if call == nil || call.Service != "keylane-submit" || call.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Fatalf("no producer span of the call from keylane-submit once submit returned (its spans are flushed before): %+v\nall: %+v", call, recv.Spans())
	}
	if err := stop(); err != nil {
		t.Fatalf("worker: %v", err)
	}
	var process, runSpan *otlptest.Span
	for _, s := range recv.Spans() {
		switch {
		case s.Name == "keylane.process traced" && s.ParentID == call.SpanID:
			process = &s
		}
	}
	if process == nil || process.TraceID != call.TraceID || process.Service != "keylane-worker" || process.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Fatalf("no consumer span of keylane-worker, child of the call's span %s in trace %s: %+v\nall: %+v", call.SpanID, call.TraceID, process, recv.Spans())
	}
	for _, s := range recv.Spans() {
		if s.Name == "keylane.run" && s.ParentID == process.SpanID {
			runSpan = &s
		}
	}
	if runSpan == nil || runSpan.TraceID != call.TraceID {
		t.Fatalf("no run span under the process span %s: %+v", process.SpanID, recv.Spans())
	}
	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused requests: %v", bad)
	}
}

// TestOTLPEndpointRefused: an --otlp-endpoint that is not an http(s) URL
// with a host is refused by both commands before anything connects, and
// so is one on submit's in-process deployment, which does not trace.
func TestOTLPEndpointRefused(t *testing.T) {
	nowhere := "nats://127.0.0.1:1"
	for _, bad := range []string{"127.0.0.1:4318", "grpc://collector:4317", "http://", "http://a b"} {
		_, err := workercmd.Parse(flag.NewFlagSet("worker", flag.ContinueOnError), []string{"--nats", nowhere, "--otlp-endpoint", bad})
		if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("worker --otlp-endpoint %q: %v", bad, err)
		}
		var out bytes.Buffer
		err = run(context.Background(), []string{"call", "--nats", nowhere, "--key", "k", "--otlp-endpoint", bad}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
			t.Errorf("submit call --otlp-endpoint %q: %v", bad, err)
		}
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"sale", "--otlp-endpoint", "http://127.0.0.1:4318"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "in-process deployment does not trace") {
		t.Errorf("sale without --nats, with --otlp-endpoint: %v", err)
	}
}
