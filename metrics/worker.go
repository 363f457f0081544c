package metrics

import (
	"time"

	"github.com/keylane/keylane"
	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets are the buckets of every keylane duration histogram, in
// seconds: half a millisecond to a minute, about 2.5× apart, so a
// reducer group of a millisecond and a flash sale's queue of tens of
// seconds both read well through histogram_quantile.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// groupBuckets are the buckets of keylane_group_jobs: powers of two up to
// the largest group a worker commits (256).
var groupBuckets = prometheus.ExponentialBuckets(1, 2, 9)

// Worker holds a worker's histograms: queue wait, run time, group size,
// end-to-end latency and lease renew latency. It is a prometheus.Collector;
// register it, and hand its Observer to the worker:
//
//	m := metrics.NewWorker()
//	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{Observer: m.Observer(), …})
//	reg.MustRegister(m, metrics.New(w))
//
// It is safe for concurrent use. Observing allocates nothing. Its series
// carry no worker label (one worker per process is the rule, and
// Prometheus adds the target's own labels); wrap the Registerer with
// prometheus.WrapRegistererWith to add one.
type Worker struct {
	queueWait, run, group, latency, renew prometheus.Histogram
}

// NewWorker returns a worker's histograms, empty.
func NewWorker() *Worker {
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "keylane_" + name, Help: help, Buckets: buckets})
	}
	m := &Worker{
		queueWait: h("job_queue_wait_seconds", "Time from the jobs stream storing a job to this worker taking it to run (server clock against worker clock).", latencyBuckets),
		run:       h("job_run_seconds", "Duration of one handler attempt, or of one reducer group with its state write.", latencyBuckets),
		group:     h("group_jobs", "Jobs settled by one reducer group commit.", groupBuckets),
		latency:   h("job_end_to_end_seconds", "Time from the jobs stream storing a job to this worker acking its outcome (a success or a dead letter).", latencyBuckets),
		renew:     h("lease_renew_seconds", "Round trip of one lease renew attempt (partition and member leases), failed ones included.", latencyBuckets),
	}
	return m
}

// Observer returns the hooks to set as keylane.WorkerConfig.Observer.
func (m *Worker) Observer() *keylane.WorkerObserver {
	return &keylane.WorkerObserver{
		QueueWait:    func(_ int, d time.Duration) { m.queueWait.Observe(d.Seconds()) },
		Run:          func(_ int, d time.Duration) { m.run.Observe(d.Seconds()) },
		Group:        func(_, jobs int) { m.group.Observe(float64(jobs)) },
		Settled:      func(_ int, d time.Duration) { m.latency.Observe(d.Seconds()) },
		LeaseRenewed: func(d time.Duration, _ error) { m.renew.Observe(d.Seconds()) },
	}
}

// Describe implements prometheus.Collector.
func (m *Worker) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Worker) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Worker) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.queueWait, m.run, m.group, m.latency, m.renew}
}
