// Package metrics exposes a keylane worker's counters to Prometheus.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.New(worker))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The collector reads Worker.Stats at scrape time; it adds nothing to the
// job path.
package metrics

import (
	"github.com/keylane/keylane"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector for one worker. It is safe for
// concurrent use.
type Collector struct {
	w       *keylane.Worker
	counter []metric
	owned   *prometheus.Desc
}

type metric struct {
	desc *prometheus.Desc
	get  func(keylane.Stats) int64
}

// New returns a collector of w's counters, labelled with its worker ID.
func New(w *keylane.Worker) *Collector {
	labels := prometheus.Labels{"worker": w.ID()}
	c := func(name, help string, get func(keylane.Stats) int64) metric {
		return metric{prometheus.NewDesc("keylane_"+name, help, nil, labels), get}
	}
	return &Collector{
		w: w,
		counter: []metric{
			c("handler_runs_total", "Handler invocations, retries included.", func(s keylane.Stats) int64 { return s.Runs }),
			c("jobs_succeeded_total", "Jobs acked after success.", func(s keylane.Stats) int64 { return s.Succeeded }),
			c("handler_failures_total", "Handler errors, each retried or dead-lettered.", func(s keylane.Stats) int64 { return s.Failed }),
			c("jobs_dead_lettered_total", "Jobs moved to the dead-letter stream.", func(s keylane.Stats) int64 { return s.DeadLettered }),
			c("messages_malformed_total", "Messages on keylane subjects that were not valid jobs.", func(s keylane.Stats) int64 { return s.Malformed }),
			c("jobs_stale_fence_total", "Jobs abandoned because a newer owner had written the key.", func(s keylane.Stats) int64 { return s.Stale }),
			c("jobs_unacked_total", "Finished jobs not acked because the lease was not trusted.", func(s keylane.Stats) int64 { return s.Unacked }),
			c("jobs_from_results_total", "Redelivered jobs answered from the results bucket.", func(s keylane.Stats) int64 { return s.FromResults }),
			c("leases_acquired_total", "Partition leases acquired.", func(s keylane.Stats) int64 { return s.Acquired }),
			c("leases_lost_total", "Partition leases lost (not released).", func(s keylane.Stats) int64 { return s.Lost }),
			c("leases_released_total", "Partition leases released gracefully.", func(s keylane.Stats) int64 { return s.Released }),
		},
		owned: prometheus.NewDesc("keylane_partitions_owned", "Partitions this worker owns now.", nil, labels),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.counter {
		ch <- m.desc
	}
	ch <- c.owned
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.w.Stats()
	for _, m := range c.counter {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(m.get(s)))
	}
	ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(s.Owned))
}
