package keylane

import (
	"context"
	"log/slog"
	"time"

	"github.com/keylane/keylane/internal/namespace"
	"github.com/nats-io/nats.go/jetstream"
)

// The namespace's streams, buckets and metadata are made, opened, checked
// and upgraded by internal/namespace; this file is its API: the
// configuration, the Topology Setup returns, and the thin calls.

// MaxStreamShards bounds TopologyConfig.StreamShards.
const MaxStreamShards = namespace.MaxStreamShards

// TopologyConfig describes the streams, consumers and buckets of a namespace.
type TopologyConfig struct {
	// Namespace prefixes every subject and object name. Defaults to "keylane".
	Namespace string
	// Partitions is N, the number of partitions. Zero means "whatever the
	// existing stream says"; when the stream does not exist, it defaults to 16.
	// A non-zero value that differs from the stream's is refused with
	// ErrPartitionMismatch.
	Partitions int
	// StreamShards is S, how many jobs streams the partitions are spread
	// over, so that S stream leaders (on different servers of a cluster)
	// share the storage work: partition p lives in shard p % S. Zero means
	// "whatever the existing namespace has", and 1 when it is created: one
	// stream named as before (see doc.go, "Shards"). A non-zero value that
	// differs from the namespace's is refused with ErrShardsMismatch. At
	// most the partition count and MaxStreamShards; a multiple of S as
	// the partition count gives every shard the same share.
	StreamShards int
	// Replicas of every stream and bucket. Zero means "whatever the
	// existing jobs stream has", and 1 when it is created (embedded
	// server); use 3 on a cluster. A non-zero value that differs from an
	// existing object's is refused with ErrReplicasMismatch.
	Replicas int
	// DuplicateWindow is how long the server remembers job IDs to drop
	// duplicate submits. Defaults to 2 minutes; never less than 2 minutes.
	DuplicateWindow time.Duration
	// LeaseTTL is the TTL of partition leases and member entries. Defaults
	// to 10s.
	LeaseTTL time.Duration
	// ResultsTTL is how long stored results live. Defaults to 1 hour.
	ResultsTTL time.Duration
	// MaxBytes bounds the jobs stream's size; -1 is unlimited. Defaults to -1.
	MaxBytes int64
	// ReplyPrefix is the only subject prefix workers reply to: clients
	// take their inboxes under it, and a job naming a reply subject outside
	// it (or a wildcard) is dead-lettered as malformed, so whoever may
	// submit a job cannot make workers publish elsewhere with their
	// permissions. Fixed in the jobs stream's metadata when it is created:
	// empty means "whatever the namespace has", and "_INBOX." when it is
	// created; another prefix than the namespace's is refused with
	// ErrReplyPrefixMismatch. Defaults to empty.
	ReplyPrefix string
	// MaxKeyBacklog caps how many jobs of one key the jobs stream holds
	// (stored and not finished: waiting, running, retrying): the next
	// submit of that key is refused by the server with ErrKeyBacklogFull
	// and stores nothing, while other keys still get in; once the worker
	// finishes some of the key's jobs, it is admitted again. A flash sale
	// of 1,000 units then queues at most about that many purchases per
	// item. Zero means "whatever the existing jobs stream has", and no
	// cap when it is created. Fixed when the namespace is created, like
	// N: a non-zero value that differs from the stream's is refused with
	// ErrKeyBacklogMismatch and nothing is changed (the server would
	// delete the oldest stored jobs of every key over a lowered or new
	// cap). Defaults to 0.
	MaxKeyBacklog int64
	// Delays lets jobs be submitted to run later (WithDelay, WithRunAt):
	// the namespace gets a delays stream (nats-server 2.12 or later, for
	// its message schedules) that only workers publish to; the jobs
	// streams take the submissions and source the jobs when due, and allow
	// neither roll-ups nor schedules (see jetstream/doc.go, "Delayed
	// jobs"). Delays excludes MaxKeyBacklog and MaxBytes: a due job that
	// the jobs stream refused (its key or the stream full) would have
	// nowhere to go but the server's source, which copies due jobs in
	// order. False means "whatever the existing stream has", and
	// none when it is created; true on a namespace made without is
	// refused with ErrDelaysOff. Fixed when the namespace is created.
	// Defaults to false.
	Delays bool

	// maxDeliver is the worker's MaxDeliver (0: not a worker's Setup,
	// which neither checks nor fixes it; -1: a worker that follows the
	// namespace's, fixing DefaultMaxDeliver if none is).
	maxDeliver int
}

// config is c as package namespace takes it.
func (c TopologyConfig) config() namespace.Config {
	return namespace.Config{
		Namespace: c.Namespace, Partitions: c.Partitions, StreamShards: c.StreamShards, Replicas: c.Replicas,
		DuplicateWindow: c.DuplicateWindow, LeaseTTL: c.LeaseTTL, ResultsTTL: c.ResultsTTL, MaxBytes: c.MaxBytes,
		ReplyPrefix: c.ReplyPrefix, MaxKeyBacklog: c.MaxKeyBacklog, Delays: c.Delays, MaxDeliver: c.maxDeliver,
	}
}

// topologyConfig is the TopologyConfig of package namespace's c.
func topologyConfig(c namespace.Config) TopologyConfig {
	return TopologyConfig{
		Namespace: c.Namespace, Partitions: c.Partitions, StreamShards: c.StreamShards, Replicas: c.Replicas,
		DuplicateWindow: c.DuplicateWindow, LeaseTTL: c.LeaseTTL, ResultsTTL: c.ResultsTTL, MaxBytes: c.MaxBytes,
		ReplyPrefix: c.ReplyPrefix, MaxKeyBacklog: c.MaxKeyBacklog, Delays: c.Delays, maxDeliver: c.MaxDeliver,
	}
}

// setDefaults fills c's zero fields and checks it (namespace.Config.SetDefaults).
func (c *TopologyConfig) setDefaults() error {
	nc := c.config()
	err := nc.SetDefaults()
	*c = topologyConfig(nc)
	return err
}

// Topology is the set of NATS objects of one namespace, opened or created:
// package namespace's Topology, whose fields (Names, Partitions, Jobs,
// Shards, Streams, Epochs, the buckets, Replicas, Meta) and methods
// (StreamOf, EpochOf) it carries, with Config as a TopologyConfig.
type Topology struct {
	*namespace.Topology
	// Config is the configuration the namespace was set up with, its
	// zero fields followed from the namespace as made (Replicas,
	// StreamShards, MaxKeyBacklog, Delays).
	Config TopologyConfig
	js     jetstream.JetStream
}

// NewState returns a State on the namespace's state bucket that ties
// entries to the epoch of their key's jobs stream shard (see ErrEpoch).
func (t *Topology) NewState() *State {
	return topologyState(t)
}

// ShardOf returns the jobs stream shard that holds partition p among s
// shards: p % s. Striding (rather than ranges) needs no table, gives every
// shard ⌊N/S⌋ or ⌈N/S⌉ partitions for any N, and spreads neighbouring
// partitions over different stream leaders.
func ShardOf(p, s int) int { return namespace.ShardOf(p, s) }

// Setup creates, or opens and checks, everything a namespace needs: the jobs
// stream, the dead-letter stream and the leases, members, results and state
// buckets. It is idempotent and safe to run from many workers at once: each
// attempt bounds every request, and an attempt that
// fails for any reason but a mismatch (partition count, replicas, bucket
// settings, bad config) or a refusal no retry cures (natserr.Permanent:
// replicas above 1 on a server that is not clustered, 10074, and the
// like; returned at once) is made again with backoff until ctx ends; an
// object a concurrent creator made is opened and checked. The
// per-partition consumers are made by the partition owner when it takes
// the lease.
func Setup(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*Topology, error) {
	return setup(ctx, js, cfg, nil)
}

// setup is Setup, saying on log (nil: nowhere) why an attempt failed
// (namespace.Setup).
func setup(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig, log *slog.Logger) (*Topology, error) {
	t, err := namespace.Setup(ctx, js, cfg.config(), log)
	if t == nil {
		return nil, err
	}
	return &Topology{Topology: t, Config: topologyConfig(t.Config), js: js}, err
}
