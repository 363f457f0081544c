package metrics

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// namespaceEvery is how long a Namespace collector reuses what it read:
// scrapes in between, by Prometheus or by several of them, cost nothing.
const namespaceEvery = 10 * time.Second

// namespaceWait bounds one read of the namespace; a scrape waits at
// most this long for it.
const namespaceWait = 5 * time.Second

// Namespace is a prometheus.Collector of what a namespace holds that no
// single owner reports: the dead letters waiting, and the partitions
// without an owner with the jobs stored in them. Every worker may
// register one: the series are labelled with the namespace, not the
// worker, and every worker reports the same values, so aggregate them
// with max by (namespace), never sum.
//
// It reads the server at scrape time, at most once every 10 seconds
// (scrapes in between reuse the last read), each read bounded to 5
// seconds: the dead-letter stream's info, each jobs stream shard's info,
// the lease bucket, and each partition's lease and consumer: 2 + shards +
// 2 × partitions requests, whatever the backlog. A read that fails (NATS unreachable, the namespace not
// set up) leaves the series out of the scrape until one succeeds; the
// worker's keylane_nats_connected says why. It is safe for concurrent
// use.
type Namespace struct {
	js        jetstream.JetStream
	namespace string
	every     time.Duration

	dead, unowned, unownedJobs *prometheus.Desc

	mu   sync.Mutex
	read time.Time // when last read; zero if the last read failed
	last namespaceCounts
}

type namespaceCounts struct {
	dead, unowned, unownedJobs uint64
}

// NewNamespace returns a collector of namespace's dead letters and
// unowned partitions, read through js.
func NewNamespace(js jetstream.JetStream, namespace string) *Namespace {
	labels := prometheus.Labels{"namespace": namespace}
	return &Namespace{
		js: js, namespace: namespace, every: namespaceEvery,
		dead: prometheus.NewDesc("keylane_dead_letters",
			"Dead letters waiting in the namespace's dead-letter stream (keylane dead list).", nil, labels),
		unowned: prometheus.NewDesc("keylane_unowned_partitions",
			"Partitions whose lease no worker holds.", nil, labels),
		unownedJobs: prometheus.NewDesc("keylane_unowned_backlog_jobs",
			"Messages stored in partitions without an owner: jobs nobody is running (a batch message counts one).", nil, labels),
	}
}

// Describe implements prometheus.Collector.
func (n *Namespace) Describe(ch chan<- *prometheus.Desc) {
	ch <- n.dead
	ch <- n.unowned
	ch <- n.unownedJobs
}

// Collect implements prometheus.Collector.
func (n *Namespace) Collect(ch chan<- prometheus.Metric) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.js.Conn().IsConnected() {
		n.read = time.Time{} // nothing to read from: no series, and no wait
		return
	}
	if n.read.IsZero() || time.Since(n.read) >= n.every {
		ctx, cancel := context.WithTimeout(context.Background(), namespaceWait)
		c, err := readNamespace(ctx, n.js, n.namespace)
		cancel()
		n.read, n.last = time.Time{}, c
		if err != nil {
			return
		}
		n.read = time.Now()
	}
	ch <- prometheus.MustNewConstMetric(n.dead, prometheus.GaugeValue, float64(n.last.dead))
	ch <- prometheus.MustNewConstMetric(n.unowned, prometheus.GaugeValue, float64(n.last.unowned))
	ch <- prometheus.MustNewConstMetric(n.unownedJobs, prometheus.GaugeValue, float64(n.last.unownedJobs))
}

// readNamespace counts a namespace's dead letters and its unowned
// partitions with their stored messages. A partition whose consumer
// exists (it had an owner once: a new owner replaces the consumer, none
// deletes it) counts its consumer's pending and unacked messages. The
// messages of partitions that never had a consumer are what the shard
// stores beyond its consumers' counts.
func readNamespace(ctx context.Context, js jetstream.JetStream, namespace string) (namespaceCounts, error) {
	var c namespaceCounts
	names := keylane.Names{Namespace: namespace}
	dead, err := js.Stream(ctx, names.Dead())
	switch {
	case err == nil:
		c.dead = dead.CachedInfo().State.Msgs
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return c, err
	}
	s0, err := js.Stream(ctx, names.Jobs())
	if err != nil {
		return c, err
	}
	md := s0.CachedInfo().Config.Metadata
	partitions, err := strconv.Atoi(md[keylane.MetaPartitions])
	if err != nil || partitions < 1 {
		return c, errors.New("metrics: the jobs stream has no partition count")
	}
	shards, err := strconv.Atoi(md[keylane.MetaShards])
	if err != nil || shards < 1 {
		shards = 1 // a namespace from before shards
	}
	streams := []jetstream.Stream{s0}
	for i := 1; i < shards; i++ {
		s, err := js.Stream(ctx, names.JobsShard(i))
		if err != nil {
			return c, err
		}
		streams = append(streams, s)
	}
	leases, err := js.KeyValue(ctx, names.Leases())
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return c, err
	}
	// Messages of each shard that no consumer accounts for.
	rest := make([]int64, shards)
	for i, s := range streams {
		rest[i] = int64(s.CachedInfo().State.Msgs)
	}
	noConsumer := make([]bool, shards) // an unowned partition of the shard has none
	for p := range partitions {
		owned := false
		if leases != nil {
			_, _, err := lease.Read(ctx, leases, names.LeaseKey(p))
			switch {
			case err == nil:
				owned = true
			case !errors.Is(err, lease.ErrFree):
				return c, err
			}
		}
		shard := keylane.ShardOf(p, shards)
		if owned {
			// Its owner reports its backlog (keylane_partition_backlog);
			// its stored messages are not the rest's.
			if cons, err := streams[shard].Consumer(ctx, names.Consumer(p)); err == nil {
				ci := cons.CachedInfo()
				rest[shard] -= int64(ci.NumPending) + int64(ci.NumAckPending)
			}
			continue
		}
		c.unowned++
		cons, err := streams[shard].Consumer(ctx, names.Consumer(p))
		switch {
		case err == nil:
			ci := cons.CachedInfo()
			c.unownedJobs += ci.NumPending + uint64(ci.NumAckPending)
			rest[shard] -= int64(ci.NumPending) + int64(ci.NumAckPending)
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			noConsumer[shard] = true
		default:
			return c, err
		}
	}
	for i, r := range rest {
		if noConsumer[i] && r > 0 {
			c.unownedJobs += uint64(r)
		}
	}
	return c, nil
}
