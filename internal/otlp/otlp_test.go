package otlp

import (
	"context"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/otlptest"
	"github.com/keylane/keylane/internal/testwait"
)

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:4318":            "http://127.0.0.1:4318/v1/traces",
		"http://collector:4318/":           "http://collector:4318/v1/traces",
		"https://otel.example/custom/path": "https://otel.example/custom/path",
		"127.0.0.1:4318":                   "",
		"grpc://collector:4317":            "",
		"http://":                          "",
		"":                                 "",
	} {
		got, err := Endpoint(in)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("Endpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if p, err := New("", "x"); p != nil || err != nil {
		t.Fatalf("New without an endpoint: %v, %v; want no provider", p, err)
	}
}

// A provider sends a span to the receiver; one whose collector is not
// there neither fails its Shutdown nor holds it up to its deadline.
func TestProvider(t *testing.T) {
	recv := otlptest.Start(t)
	p, err := New(recv.URL, "keylane-test")
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer("t").Start(context.Background(), "one")
	span.End()
	if err := Shutdown(p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, "the span received", func() bool {
		s := recv.Spans()
		return len(s) == 1 && s[0].Name == "one" && s[0].Service == "keylane-test"
	})
	gone, err := New("http://127.0.0.1:1", "keylane-test")
	if err != nil {
		t.Fatal(err)
	}
	_, span = gone.Tracer("t").Start(context.Background(), "lost")
	span.End()
	if err := Shutdown(gone, 5*time.Second); err != nil {
		t.Fatalf("Shutdown with no collector: %v", err)
	}
}
