package keylane

import (
	"errors"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/tracing"
	"github.com/nats-io/nats.go"
)

// OpenTelemetry tracing, off unless ClientConfig.TracerProvider or
// WorkerConfig.TracerProvider is set. The spans and why they are shaped
// so are written down in doc.go ("Tracing"); internal/tracing makes them.
// Off, every hook below is a nil check: no header is written or read,
// nothing is allocated.
//
// The client's hooks sit at one call per site: Submit, Call and
// SubmitMany start a send span and inject its context into the job's
// headers. The worker's, where a job runs, commits and settles, are
// internal/tenure's (tracehooks.go); the Worker builds their
// tracing.Worker (newWorkerTracing) and hands it to each tenure.

// newClientTracing makes a client's send spans (internal/client calls
// them); nil when tracing is off.
func newClientTracing(cfg ClientConfig, nc *nats.Conn) *tracing.Client {
	return tracing.NewClient(tracing.ClientConfig{
		TracerProvider: cfg.TracerProvider, Propagator: cfg.Propagator, Namespace: cfg.Namespace,
		// The size Client.message allows: max_payload less DeadLetterReserve.
		Fits:      func(m *nats.Msg) bool { return messageSize(m) <= nc.MaxPayload()-DeadLetterReserve },
		Duplicate: func(err error) bool { return errors.Is(err, ErrDuplicate) },
		Remote:    remoteFailure,
	})
}

// messageSize is roughly what a message takes against max_payload.
var messageSize = core.MessageSize

// remoteFailure reads a RemoteError for a send span.
func remoteFailure(err error) (permanent, deadLettered, ok bool) {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Permanent, re.DeadLettered, true
	}
	return false, false, false
}

// newWorkerTracing makes a worker's spans (internal/tenure runs them);
// nil when tracing is off.
func newWorkerTracing(cfg WorkerConfig) *tracing.Worker {
	return tracing.NewWorker(tracing.WorkerConfig{
		TracerProvider: cfg.TracerProvider, Propagator: cfg.Propagator,
		Worker: cfg.ID, Namespace: cfg.Topology.Namespace, Consumer: Names{}.Consumer,
	})
}
