package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/partition"
	"github.com/prometheus/client_golang/prometheus"
)

// Client holds a client's metrics: keylane_client_jobs_total, by
// operation and outcome, and keylane_client_request_seconds, by
// operation. It is a prometheus.Collector; register it, and hand its
// Observer to the client:
//
//	m := metrics.NewClient()
//	reg.MustRegister(m)
//	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Observer: m.Observer()})
//
// It is safe for concurrent use.
type Client struct {
	jobs    *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

// The operations a client reports (label "op").
const (
	OpSubmit     = "submit"
	OpCall       = "call"
	OpSubmitMany = "submit_many"
)

// The outcomes of a client's jobs (label "outcome"). Outcome names the
// kind of an error a client returns.
const (
	OutcomeOK          = "ok"
	OutcomeDuplicate   = "duplicate"    // Submit: the ID was stored before; nothing new stored
	OutcomeRemoteError = "remote_error" // Call: the handler failed (a *keylane.RemoteError)
	OutcomeNoReply     = "no_reply"     // Call: ctx ended before the outcome came
	OutcomeCanceled    = "canceled"     // Submit: ctx ended before the stream's ack
	OutcomeInvalid     = "invalid"      // refused before sending: key, job ID, type, header or payload
	OutcomeNoTopology  = "no_topology"  // the namespace's jobs stream does not exist
	OutcomeClosed      = "closed"       // the client was closed
	OutcomeBacklogFull = "backlog_full" // refused at admission: the key's backlog is at its cap
	OutcomeError       = "error"        // anything else (the server refused, a connection failed)
)

// NewClient returns a client's metrics, empty.
func NewClient() *Client {
	return &Client{
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keylane_client_jobs_total",
			Help: "Jobs a client submitted or called, by operation and outcome (submit_many counts each job).",
		}, []string{"op", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keylane_client_request_seconds",
			Help:    "Duration of one Submit, Call (until its result) or SubmitMany (all its jobs).",
			Buckets: latencyBuckets,
		}, []string{"op"}),
	}
}

// Observer returns the hooks to set as keylane.ClientConfig.Observer. It
// creates every operation's outcome series at 0, so rates over them work
// from the first scrape.
func (m *Client) Observer() *keylane.ClientObserver {
	submit, call := m.outcomes(OpSubmit, allOutcomes...), m.outcomes(OpCall, allOutcomes...)
	submitTook, callTook, manyTook := m.latency.WithLabelValues(OpSubmit), m.latency.WithLabelValues(OpCall), m.latency.WithLabelValues(OpSubmitMany)
	many := m.outcomes(OpSubmitMany, OutcomeOK, OutcomeError)
	manyOK, manyErr := many[OutcomeOK], many[OutcomeError]
	return &keylane.ClientObserver{
		Submitted: func(d time.Duration, err error) {
			submitTook.Observe(d.Seconds())
			submit[Outcome(err)].Inc()
		},
		Called: func(d time.Duration, err error) {
			callTook.Observe(d.Seconds())
			call[Outcome(err)].Inc()
		},
		SubmittedMany: func(d time.Duration, jobs, failed int) {
			manyTook.Observe(d.Seconds())
			manyOK.Add(float64(jobs - failed))
			manyErr.Add(float64(failed))
		},
	}
}

var allOutcomes = []string{OutcomeOK, OutcomeDuplicate, OutcomeRemoteError, OutcomeNoReply, OutcomeCanceled, OutcomeInvalid, OutcomeNoTopology, OutcomeClosed, OutcomeBacklogFull, OutcomeError}

// outcomes returns op's counters of the given outcomes, looked up once.
func (m *Client) outcomes(op string, outcomes ...string) map[string]prometheus.Counter {
	cs := make(map[string]prometheus.Counter, len(outcomes))
	for _, o := range outcomes {
		cs[o] = m.jobs.WithLabelValues(op, o)
	}
	return cs
}

// Outcome returns the outcome label of a client's error: OutcomeOK for
// nil, else the kind of error.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, keylane.ErrDuplicate):
		return OutcomeDuplicate
	case isRemote(err):
		return OutcomeRemoteError
	case errors.Is(err, keylane.ErrNoReply):
		return OutcomeNoReply
	case errors.Is(err, keylane.ErrClosed):
		return OutcomeClosed
	case errors.Is(err, keylane.ErrNoTopology):
		return OutcomeNoTopology
	case errors.Is(err, keylane.ErrKeyBacklogFull):
		return OutcomeBacklogFull
	case errors.Is(err, keylane.ErrBadJobID), errors.Is(err, keylane.ErrPayloadTooLarge),
		errors.Is(err, keylane.ErrBadType), errors.Is(err, keylane.ErrReservedHeader), errors.Is(err, keylane.ErrBadHeader),
		errors.Is(err, partition.ErrEmptyKey), errors.Is(err, partition.ErrKeyTooLong), errors.Is(err, partition.ErrKeyNotUTF8),
		errors.Is(err, partition.ErrKeyControl), errors.Is(err, partition.ErrKeySpace):
		return OutcomeInvalid
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	}
	return OutcomeError
}

// isRemote reports whether err holds a *keylane.RemoteError, without the
// allocation of errors.As.
func isRemote(err error) bool {
	_, ok := errors.AsType[*keylane.RemoteError](err)
	return ok
}

// Describe implements prometheus.Collector.
func (m *Client) Describe(ch chan<- *prometheus.Desc) {
	m.jobs.Describe(ch)
	m.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Client) Collect(ch chan<- prometheus.Metric) {
	m.jobs.Collect(ch)
	m.latency.Collect(ch)
}
