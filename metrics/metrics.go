// Package metrics exposes keylane workers and clients to Prometheus.
//
//	reg := prometheus.NewRegistry()
//	wm := metrics.NewWorker() // histograms, fed through the worker's Observer
//	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{Observer: wm.Observer(), …})
//	reg.MustRegister(wm, metrics.New(w))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// and on the producing side
//
//	cm := metrics.NewClient()
//	reg.MustRegister(cm)
//	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Observer: cm.Observer()})
//
// New's Collector reads Worker.Stats and Worker.Tenures at scrape time (it
// asks the NATS server nothing) and adds nothing to the job path.
// NewNamespaces's reports what no single owner knows, for its own
// namespace and every other one the account lists (live workers, the
// partitions without a live owner and their backlog, the dead letters
// waiting, each partition's lag and oldest waiting job), from a bounded
// read of the server at most every 10 seconds: a namespace whose workers
// all died is reported by the others'. Connected and BuildInfo report
// the connection's state and the build:
//
//	reg.MustRegister(metrics.NewNamespaces(js, "keylane"), metrics.Connected(nc, w.ID()), metrics.BuildInfo())
//
// The histograms of NewWorker and NewClient are fed by the observers,
// which allocate nothing per job; a worker or client without an observer
// measures nothing and reads no clock for it.
//
// The metric names, and a Grafana dashboard that uses them
// (docs/grafana/keylane.json), are listed in docs/metrics.md; the gauges
// to page on, and alert rules for them (docs/alerts.yml), in
// docs/oncall.md.
package metrics

import (
	"strconv"

	"github.com/keylane/keylane"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector for one worker. It is safe for
// concurrent use.
type Collector struct {
	w       *keylane.Worker
	counter []metric
	owned   *prometheus.Desc

	backlog, inFlight, trustedFor *prometheus.Desc // by partition
}

type metric struct {
	desc *prometheus.Desc
	get  func(keylane.Stats) int64
}

// New returns a collector of w's counters (Worker.Stats) and of its owned
// partitions' backlog, in-flight jobs and lease headroom (Worker.Tenures),
// all labelled with its worker ID. A partition counts as owned while its
// lease is trusted: keylane_partitions_owned and the partition's series
// drop at the lease's trust deadline when its renews stop (a NATS
// outage), not once its owner has wound down.
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
			c("partition_resyncs_total", "Re-synchronisations of a partition's delivery (a delivery gap, a reconnect, missed heartbeats).", func(s keylane.Stats) int64 { return s.Resyncs }),
			c("jobs_gap_total", "Jobs refused because a later job of their key had been applied (dead-lettered, never answered as a success).", func(s keylane.Stats) int64 { return s.Gaps }),
			c("dead_letter_errors_total", "Failed dead-letter writes (the job stays in its lane until one succeeds).", func(s keylane.Stats) int64 { return s.DeadLetterErrors }),
			c("jobs_handed_back_total", "Jobs a retrying key handed back to the server.", func(s keylane.Stats) int64 { return s.HandedBack }),
			c("lease_renew_failures_total", "Lease renew attempts that failed (timeout, conflict, disconnect), partition and member leases.", func(s keylane.Stats) int64 { return s.RenewFailures }),
			c("owners_stuck_total", "Owners whose handlers kept running after their lease was lost.", func(s keylane.Stats) int64 { return s.Stuck }),
		},
		owned: prometheus.NewDesc("keylane_partitions_owned", "Partitions whose lease this worker still trusts.", nil, labels),
		backlog: prometheus.NewDesc("keylane_partition_backlog",
			"Jobs stored in an owned partition and not yet delivered to this worker, as of the last delivery (the consumer's pending count).", []string{"partition"}, labels),
		inFlight: prometheus.NewDesc("keylane_partition_in_flight",
			"Jobs of an owned partition fetched by this worker and not finished.", []string{"partition"}, labels),
		trustedFor: prometheus.NewDesc("keylane_lease_trusted_for_seconds",
			"How long an owned partition's lease stays trusted without another successful renew (the trust window's headroom).", []string{"partition"}, labels),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.counter {
		ch <- m.desc
	}
	ch <- c.owned
	ch <- c.backlog
	ch <- c.inFlight
	ch <- c.trustedFor
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.w.Stats()
	for _, m := range c.counter {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(m.get(s)))
	}
	ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(s.Owned))
	for _, t := range c.w.Tenures() {
		p := strconv.Itoa(t.Partition)
		ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(t.Backlog), p)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(t.InFlight), p)
		ch <- prometheus.MustNewConstMetric(c.trustedFor, prometheus.GaugeValue, t.TrustedFor.Seconds(), p)
	}
}
