package jetstream

import (
	"strconv"
	"strings"
)

// Header names on job, reply and dead-letter messages. The job ID travels in
// the standard Nats-Msg-Id header so the server de-duplicates submits.
const (
	HeaderJobID     = "Nats-Msg-Id"
	HeaderKey       = "Keylane-Key"
	HeaderType      = "Keylane-Type"
	HeaderReply     = "Keylane-Reply"
	HeaderError     = "Keylane-Error"
	HeaderErrorKind = "Keylane-Error-Kind"
	HeaderAttempts  = "Keylane-Attempts"
	HeaderWorker    = "Keylane-Worker"
	HeaderSeq       = "Keylane-Seq"
	HeaderPartition = "Keylane-Partition"
	HeaderFence     = "Keylane-Fence"
	// HeaderPayloadDropped on a dead letter gives the length of a payload
	// left out because the dead letter would not have fit max_payload.
	HeaderPayloadDropped = "Keylane-Payload-Dropped"
	// HeaderPartitions carries the partition count the client routed the
	// job with; a worker refuses a job routed with another N.
	HeaderPartitions = "Keylane-Partitions"
	// HeaderIdempotent marks a job whose ID the caller chose and may retry
	// with: workers keep its outcome by ID for the results TTL.
	HeaderIdempotent = "Keylane-Idempotent"
	// HeaderKeepOutcome asks the worker to keep the job's outcome by ID
	// (every Call does, so a reply lost with a connection is recovered).
	HeaderKeepOutcome = "Keylane-Keep-Outcome"
)

// Metadata keys written into the jobs stream's configuration.
const (
	MetaPartitions = "keylane.partitions"
	MetaHash       = "keylane.hash"
	MetaVersion    = "keylane.version"
	// MetaEpoch identifies the jobs stream (hex); see Meta.Epoch.
	MetaEpoch = "keylane.epoch"
	// MetaAdopted lists adopted epochs (hex, comma-separated).
	MetaAdopted = "keylane.adopted"
	// MetaReplyPrefix is where workers may reply.
	MetaReplyPrefix = "keylane.reply-prefix"
	// MetaShards is S, how many jobs streams the namespace's partitions
	// are spread over; absent means 1.
	MetaShards = "keylane.shards"
	// MetaShard is the stream's own shard index in [0, S); absent means 0.
	MetaShard = "keylane.shard"
)

// Names derives every NATS object name from a namespace.
type Names struct {
	Namespace string
}

func (n Names) upper() string { return strings.ToUpper(strings.ReplaceAll(n.Namespace, "-", "_")) }

// Jobs is the jobs stream, e.g. KEYLANE_JOBS.
func (n Names) Jobs() string { return n.upper() + "_JOBS" }

// JobsShard is the jobs stream of shard i: shard 0 is Jobs, so a
// namespace of one shard keeps its name, and shard i > 0 is e.g.
// KEYLANE_JOBS_2.
func (n Names) JobsShard(i int) string {
	if i == 0 {
		return n.Jobs()
	}
	return n.Jobs() + "_" + strconv.Itoa(i)
}

// Dead is the dead-letter stream, e.g. KEYLANE_DEAD.
func (n Names) Dead() string { return n.upper() + "_DEAD" }

// Leases is the partition-lease bucket, e.g. KEYLANE_LEASES.
func (n Names) Leases() string { return n.upper() + "_LEASES" }

// Members is the worker-membership bucket, e.g. KEYLANE_MEMBERS.
func (n Names) Members() string { return n.upper() + "_MEMBERS" }

// Results is the results bucket, e.g. KEYLANE_RESULTS.
func (n Names) Results() string { return n.upper() + "_RESULTS" }

// State is the per-key state bucket, e.g. KEYLANE_STATE.
func (n Names) State() string { return n.upper() + "_STATE" }

// Consumer is the durable consumer of partition p, e.g. p3.
func (n Names) Consumer(p int) string { return "p" + strconv.Itoa(p) }

// LeaseKey is the lease bucket key of partition p, e.g. p.3.
func (n Names) LeaseKey(p int) string { return "p." + strconv.Itoa(p) }
