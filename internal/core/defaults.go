package core

import "time"

// Defaults of TopologyConfig, WorkerConfig and ClientConfig (package
// keylane re-exports the exported ones): a zero field takes these. Commands use them for their flags' defaults too, so the
// numbers live here only.
const (
	DefaultNamespace       = "keylane"
	DefaultPartitions      = 16 // when a worker creates the jobs stream
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultLeaseTTL        = 10 * time.Second
	DefaultResultsTTL      = time.Hour
	DefaultReplyPrefix     = "_INBOX."

	DefaultConcurrency = 8
	// DefaultApplierConcurrency is Concurrency's default for a worker
	// with an Applier: the ready groups of that many keys of a partition
	// share its next transaction, and a key's group is often one job.
	DefaultApplierConcurrency = 64
	DefaultMaxInFlight        = 1024
	DefaultMaxDeliver         = 5
	DefaultAckWait            = 30 * time.Second

	DefaultClientMaxPending = 4096

	// SyncAlwaysOutcomeBatch is the WorkerConfig.OutcomeBatch to set on
	// a one-replica server that fsyncs every write (sync_interval:
	// always); cmd/worker --sync-always sets it for its embedded server.
	SyncAlwaysOutcomeBatch = 16
)

// Limits of the same configurations.
const (
	MinDuplicateWindow = 2 * time.Minute
	MinLeaseTTL        = 300 * time.Millisecond
	MinAckWait         = time.Second
)

// Named timeouts of keylane's own requests to the server. Each request to
// the server has a deadline: in a cluster, one sent during a leader
// election gets no answer at all, and it is better asked again than waited
// out.
const (
	// RequestTimeout bounds one request that has no deadline of its own.
	RequestTimeout = 5 * time.Second
	// CounterTimeout bounds the crash-loop counter's read-modify-write and
	// its removal.
	CounterTimeout = 5 * time.Second
	// ResultLookupTimeout bounds a look-up of a job's kept outcome.
	ResultLookupTimeout = 5 * time.Second
	// ReleaseHold is how long an owner whose consumer cannot be opened
	// (a missing or replaced stream) keeps its lease before handing it
	// back, so partitions do not spin between acquire and release.
	ReleaseHold = time.Second
	// ResyncCalm is how long re-synchronisations must stay apart before
	// their backoff starts from its shortest pause again.
	ResyncCalm = 10 * time.Second
)

// DefaultBackoff is WorkerConfig.Backoff's default: 50ms doubling per
// attempt, at most 5s.
func DefaultBackoff(n int) time.Duration {
	return min(50*time.Millisecond<<min(n-1, 10), 5*time.Second)
}
