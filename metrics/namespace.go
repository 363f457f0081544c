package metrics

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// namespaceEvery is how long a Namespace collector reuses what it read:
// scrapes in between, by Prometheus or by several of them, cost nothing.
const namespaceEvery = 10 * time.Second

// namespaceWait bounds one read of the namespaces; a scrape waits at
// most this long for it.
const namespaceWait = 5 * time.Second

// Namespace is a prometheus.Collector of what a namespace holds that no
// single worker reports, read from the server: its live workers, the
// partitions without a live owner and the jobs stored in them, the dead
// letters waiting, and per partition the jobs not yet finished (lag) and
// how long the oldest of them has waited. Every series is labelled with
// the namespace (and the partition), never with the worker that reports
// it: every process that registers one reports the same values, so
// aggregate them with max by (namespace), never sum.
//
// A namespace whose workers are all dead has nobody of its own left to
// report it. NewNamespaces reports, besides the namespaces it is given,
// every keylane namespace the account's stream list shows: a worker of
// another namespace, or an exporter that serves no namespace at all,
// then reports the dead one with keylane_namespace_workers 0 and every
// partition unowned. This is how queue libraries watch their queues
// (asynq's queue metrics collector, the NATS surveyor, the Sidekiq and
// River exporters): the shared store is read by whoever is alive, not
// by the processes it describes.
//
// Liveness is read from the leases and members buckets by the server's
// clock (lease.Lapsed): a worker or an owner whose entry was not renewed
// for two thirds of the lease TTL is not counted as live, though the
// server keeps its entry until the TTL has passed.
//
// It reads the server at scrape time, at most once every 10 seconds
// (scrapes in between reuse the last read), the whole read bounded to 5
// seconds. Per namespace: the dead-letter stream's info, each jobs stream
// shard's info, each partition's consumer info, the leases and members
// buckets (their status and a watch of their entries), and one message
// look-up per partition that holds jobs (the oldest one's time stamp):
// at most 7 + shards + 2 × partitions requests, plus the stream list
// with NewNamespaces (its own namespaces first, the list bounded to 2
// seconds), whatever the backlog. A namespace
// whose read fails (NATS unreachable, the namespace not set up, no
// permission) is left out of the scrape until a read succeeds; the
// worker's keylane_nats_connected says why. It is safe for concurrent
// use.
type Namespace struct {
	js       jetstream.JetStream
	fixed    []string // read always
	discover bool     // and every namespace the stream list shows
	every    time.Duration

	dead, unowned, unownedJobs, workers, partitions, lag, oldest, oldestAt *prometheus.Desc

	mu   sync.Mutex
	read time.Time // when last read; zero if nothing was read
	last []namespaceCounts
}

type namespaceCounts struct {
	namespace                  string
	dead, unowned, unownedJobs uint64
	workers, partitions        int
	part                       []partitionCounts
}

// partitionCounts is one partition's lag and oldest waiting job, for a
// partition that has a consumer (it had an owner once) or holds jobs.
type partitionCounts struct {
	p int
	// lag counts the messages stored and not yet acked: the consumer's
	// pending plus its delivered-and-unacked (a batch message counts one).
	lag uint64
	// hasLag is false for a partition that never had a consumer.
	hasLag bool
	// oldest is the age of the oldest job stored on the partition's
	// subjects, by the server's clock; 0 if it stores none. oldestAt is
	// when the server stored it (zero if none).
	oldest   time.Duration
	oldestAt time.Time
}

// NewNamespace returns a collector of one namespace's gauges, read
// through js.
func NewNamespace(js jetstream.JetStream, namespace string) *Namespace {
	return newNamespace(js, []string{namespace}, false)
}

// NewNamespaces returns a collector of the gauges of the given
// namespaces and of every other keylane namespace that js's account
// lists (a jobs stream with keylane's metadata). Where the account may
// not list streams, it reports the given namespaces alone. A worker
// registers NewNamespaces(js, itsNamespace); an exporter that runs no
// worker, NewNamespaces(js).
func NewNamespaces(js jetstream.JetStream, namespaces ...string) *Namespace {
	return newNamespace(js, slices.Clone(namespaces), true)
}

func newNamespace(js jetstream.JetStream, fixed []string, discover bool) *Namespace {
	ns, nsp := []string{"namespace"}, []string{"namespace", "partition"}
	return &Namespace{
		js: js, fixed: fixed, discover: discover, every: namespaceEvery,
		dead: prometheus.NewDesc("keylane_dead_letters",
			"Dead letters waiting in the namespace's dead-letter stream (keylane dead list).", ns, nil),
		unowned: prometheus.NewDesc("keylane_unowned_partitions",
			"Partitions without a live owner: their lease is free, or its holder's renews lapsed.", ns, nil),
		unownedJobs: prometheus.NewDesc("keylane_unowned_backlog_jobs",
			"Messages stored in partitions without a live owner: jobs nobody is running (a batch message counts one).", ns, nil),
		workers: prometheus.NewDesc("keylane_namespace_workers",
			"Workers of the namespace whose member entry is live (renewed within two thirds of the lease TTL, by the server's clock).", ns, nil),
		partitions: prometheus.NewDesc("keylane_namespace_partitions",
			"Partitions of the namespace.", ns, nil),
		lag: prometheus.NewDesc("keylane_partition_lag_messages",
			"Messages stored in a partition and not yet acked: not yet delivered plus delivered and unfinished (a batch message counts one).", nsp, nil),
		oldest: prometheus.NewDesc("keylane_oldest_waiting_job_age_seconds",
			"Age of the oldest job stored in a partition and not yet finished, by the server's clock (0 if none waits).", nsp, nil),
		oldestAt: prometheus.NewDesc("keylane_oldest_waiting_job_timestamp_seconds",
			"Unix time at which the server stored a partition's oldest job not yet finished; no series while none waits. Alert on time() minus it: it ages between reads.", nsp, nil),
	}
}

// Describe implements prometheus.Collector.
func (n *Namespace) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{n.dead, n.unowned, n.unownedJobs, n.workers, n.partitions, n.lag, n.oldest, n.oldestAt} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (n *Namespace) Collect(ch chan<- prometheus.Metric) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.js.Conn().IsConnected() {
		n.read, n.last = time.Time{}, nil // nothing to read from: no series, and no wait
		return
	}
	if n.read.IsZero() || time.Since(n.read) >= n.every {
		ctx, cancel := context.WithTimeout(context.Background(), namespaceWait)
		n.last = n.readAll(ctx)
		cancel()
		n.read = time.Time{}
		if len(n.last) > 0 {
			n.read = time.Now()
		}
	}
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, c := range n.last {
		g(n.dead, float64(c.dead), c.namespace)
		g(n.unowned, float64(c.unowned), c.namespace)
		g(n.unownedJobs, float64(c.unownedJobs), c.namespace)
		g(n.workers, float64(c.workers), c.namespace)
		g(n.partitions, float64(c.partitions), c.namespace)
		for _, pc := range c.part {
			p := strconv.Itoa(pc.p)
			if pc.hasLag {
				g(n.lag, float64(pc.lag), c.namespace, p)
			}
			g(n.oldest, pc.oldest.Seconds(), c.namespace, p)
			if !pc.oldestAt.IsZero() {
				g(n.oldestAt, float64(pc.oldestAt.UnixNano())/1e9, c.namespace, p)
			}
		}
	}
}

// readAll reads every namespace the collector reports; those whose read
// failed are left out. The given namespaces come first: a user that may
// not list streams (a worker's, docs/security.md) still reports its own,
// and the listing gets what is left of the bound, at most listWait.
func (n *Namespace) readAll(ctx context.Context) []namespaceCounts {
	var out []namespaceCounts
	done := map[string]bool{}
	read := func(ns string) {
		if done[ns] {
			return
		}
		done[ns] = true
		if c, err := readNamespace(ctx, n.js, ns); err == nil {
			out = append(out, c)
		}
	}
	for _, ns := range n.fixed {
		read(ns)
	}
	if n.discover {
		lctx, cancel := context.WithTimeout(ctx, listWait)
		found, err := listNamespaces(lctx, n.js)
		cancel()
		if err == nil {
			for _, ns := range found {
				read(ns)
			}
		}
	}
	slices.SortFunc(out, func(a, b namespaceCounts) int { return strings.Compare(a.namespace, b.namespace) })
	return out
}

// listWait bounds the stream list of a read.
const listWait = 2 * time.Second

// listNamespaces returns the namespaces whose jobs stream (shard 0) the
// account lists: a stream with keylane's partition count in its metadata,
// named after the namespace its subjects begin with.
func listNamespaces(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var out []string
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		if info.Config.Metadata[keylane.MetaPartitions] == "" || len(info.Config.Subjects) == 0 {
			continue
		}
		ns, _, ok := strings.Cut(info.Config.Subjects[0], ".jobs.")
		if ok && ns != "" && (keylane.Names{Namespace: ns}).Jobs() == info.Config.Name {
			out = append(out, ns)
		}
	}
	return out, l.Err()
}

// readNamespace reads a namespace's gauges. A partition is owned if its
// lease entry is there and not lapsed (lease.Lapsed, by the server's
// clock); an unowned partition whose consumer exists (it had an owner
// once: a new owner replaces the consumer, none deletes it) counts its
// consumer's pending and unacked messages. The messages of partitions
// that never had a consumer are what the shard stores beyond its
// consumers' counts.
func readNamespace(ctx context.Context, js jetstream.JetStream, namespace string) (namespaceCounts, error) {
	c := namespaceCounts{namespace: namespace}
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
	info0 := s0.CachedInfo()
	md := info0.Config.Metadata
	partitions, err := strconv.Atoi(md[keylane.MetaPartitions])
	if err != nil || partitions < 1 {
		return c, errors.New("metrics: the jobs stream has no partition count")
	}
	c.partitions = partitions
	shards, err := strconv.Atoi(md[keylane.MetaShards])
	if err != nil || shards < 1 {
		shards = 1 // a namespace from before shards
	}
	// The server's clock: entries' and messages' time stamps are the
	// server's, so their ages are read against it, not against ours.
	now := info0.TimeStamp
	if now.IsZero() {
		now = time.Now() // a server that does not say
	}
	streams := []jetstream.Stream{s0}
	for i := 1; i < shards; i++ {
		s, err := js.Stream(ctx, names.JobsShard(i))
		if err != nil {
			return c, err
		}
		streams = append(streams, s)
	}
	live, err := liveHolders(ctx, js, names.Leases(), now)
	if err != nil {
		return c, err
	}
	members, err := liveHolders(ctx, js, names.Members(), now)
	if err != nil {
		return c, err
	}
	c.workers = len(members)

	// Messages of each shard that no consumer accounts for.
	rest := make([]int64, shards)
	for i, s := range streams {
		rest[i] = int64(s.CachedInfo().State.Msgs)
	}
	noConsumer := make([]bool, shards) // an unowned partition of the shard has none
	for p := range partitions {
		shard := keylane.ShardOf(p, shards)
		s := streams[shard]
		// One consumer info each, not the stream's consumer list: a
		// worker's user may read its partitions' consumers, not list
		// them (docs/security.md).
		var ci *jetstream.ConsumerInfo
		switch cons, err := s.Consumer(ctx, names.Consumer(p)); {
		case err == nil:
			ci = cons.CachedInfo()
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return c, err
		}
		pc := partitionCounts{p: p}
		var after uint64 // the oldest waiting job's sequence is above it
		if ci != nil {
			pc.lag, pc.hasLag = ci.NumPending+uint64(ci.NumAckPending), true
			rest[shard] -= int64(pc.lag)
			after = ci.AckFloor.Stream
		}
		if pc.lag > 0 || ci == nil && s.CachedInfo().State.Msgs > 0 {
			m, err := s.GetMsg(ctx, after+1, jetstream.WithGetMsgSubject(partition.Filter(namespace, p)))
			switch {
			case err == nil:
				pc.oldest, pc.oldestAt = max(now.Sub(m.Time), 0), m.Time
			case !errors.Is(err, jetstream.ErrMsgNotFound):
				return c, err
			}
		}
		c.part = append(c.part, pc)
		if _, owned := live[names.LeaseKey(p)]; owned {
			continue // its owner reports its backlog (keylane_partition_backlog)
		}
		c.unowned++
		if ci != nil {
			c.unownedJobs += pc.lag
		} else {
			noConsumer[shard] = true
		}
	}
	for i, r := range rest {
		if noConsumer[i] && r > 0 {
			c.unownedJobs += uint64(r)
		}
	}
	return c, nil
}

// liveHolders reads a lease bucket (the partitions' leases, or the
// members): its keys whose entry holds a lease that has not lapsed as of
// now (the server's clock). A bucket not made yet holds none.
func liveHolders(ctx context.Context, js jetstream.JetStream, bucket string, now time.Time) (map[string]lease.Info, error) {
	live := map[string]lease.Info{}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return live, nil
	}
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	ttl := st.TTL()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("metrics: watch of " + bucket + " ended")
			}
			if e == nil { // the initial values are all in
				return live, nil
			}
			info, err := lease.Decode(e.Value())
			if err != nil || lease.Lapsed(e.Created(), now, ttl) {
				continue
			}
			live[e.Key()] = info
		}
	}
}
