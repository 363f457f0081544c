// Package otlp is the commands' --otlp-endpoint: a tracer provider that
// sends keylane's spans over OTLP/HTTP (protobuf) to a collector, for the
// worker and submit commands. The library itself only takes a
// trace.TracerProvider (WorkerConfig, ClientConfig); the exporter and its
// dependencies stay out of its import graph.
package otlp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// FlagName is the flag Register adds.
const FlagName = "otlp-endpoint"

// Register adds --otlp-endpoint to fs, defaulting to the environment's
// KEYLANE_OTLP_ENDPOINT, and returns where the value goes.
func Register(fs *flag.FlagSet) *string {
	return fs.String(FlagName, os.Getenv("KEYLANE_OTLP_ENDPOINT"),
		"send trace spans over OTLP/HTTP to this collector URL, e.g. http://127.0.0.1:4318 (the path /v1/traces is added when the URL has none); empty: no tracing (env KEYLANE_OTLP_ENDPOINT)")
}

// Endpoint checks an --otlp-endpoint value and returns the URL spans are
// posted to: http or https, a host, and the path /v1/traces when the URL
// has no path.
func Endpoint(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("--%s %q: %w", FlagName, raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--%s %q: want an http:// or https:// URL with a host, e.g. http://127.0.0.1:4318", FlagName, raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Provider is a tracer provider exporting to a collector; Shutdown sends
// the spans still buffered and stops it.
type Provider = sdktrace.TracerProvider

// New returns a tracer provider that batches spans and posts them to
// endpoint (an --otlp-endpoint value), naming the process service (the
// resource's service.name) unless the environment names it
// (OTEL_SERVICE_NAME, or service.name in OTEL_RESOURCE_ATTRIBUTES, whose
// other attributes are added too). An empty endpoint returns nil and no error:
// tracing stays off. Export failures do not stop the command: the
// exporter retries for a while, then drops the batch (OpenTelemetry's
// global error handler logs it). The caller calls Shutdown, with a
// deadline, after the last span ended.
func New(endpoint, service string) (*Provider, error) {
	if endpoint == "" {
		return nil, nil
	}
	u, err := Endpoint(endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpointURL(u),
		otlptracehttp.WithTimeout(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", FlagName, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("--%s: %w", FlagName, err)
	}
	// The environment's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// win over the command's name, as every OpenTelemetry SDK reads them.
	env, err := resource.New(context.Background(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("--%s: OTEL_RESOURCE_ATTRIBUTES: %w", FlagName, err)
	}
	if res, err = resource.Merge(res, env); err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("--%s: %w", FlagName, err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Shutdown flushes and stops p within timeout; a nil p is nothing to do.
func Shutdown(p *Provider, timeout time.Duration) error {
	if p == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		return fmt.Errorf("--%s: flush the last spans: %w", FlagName, err)
	}
	return nil
}
