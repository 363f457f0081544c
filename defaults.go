package keylane

import (
	"time"

	"github.com/keylane/keylane/internal/core"
)

// Defaults of TopologyConfig, WorkerConfig and ClientConfig: a zero field
// takes these. Commands use them for their flags' defaults too, so the
// numbers live in one place (internal/core).
const (
	DefaultNamespace       = core.DefaultNamespace
	DefaultPartitions      = core.DefaultPartitions
	DefaultDuplicateWindow = core.DefaultDuplicateWindow
	DefaultLeaseTTL        = core.DefaultLeaseTTL
	DefaultResultsTTL      = core.DefaultResultsTTL
	DefaultReplyPrefix     = core.DefaultReplyPrefix
	DefaultConcurrency     = core.DefaultConcurrency
	// DefaultApplierConcurrency is Concurrency's default for a worker
	// with an Applier: the ready groups of that many keys of a partition
	// share its next transaction, and a key's group is often one job.
	DefaultApplierConcurrency = core.DefaultApplierConcurrency
	DefaultMaxInFlight        = core.DefaultMaxInFlight
	DefaultMaxDeliver         = core.DefaultMaxDeliver
	DefaultAckWait            = core.DefaultAckWait
	DefaultClientMaxPending   = core.DefaultClientMaxPending
	// SyncAlwaysOutcomeBatch is the WorkerConfig.OutcomeBatch to set on
	// a one-replica server that fsyncs every write (sync_interval:
	// always); cmd/worker --sync-always sets it for its embedded server.
	SyncAlwaysOutcomeBatch = core.SyncAlwaysOutcomeBatch
	MinDuplicateWindow     = core.MinDuplicateWindow
	MinLeaseTTL            = core.MinLeaseTTL
	MinAckWait             = core.MinAckWait
)

// requestTimeout bounds one request of keylane's own (internal/core says
// what it bounds).
const requestTimeout = core.RequestTimeout

// defaultBackoff is WorkerConfig.Backoff's default: 50ms doubling per
// attempt, at most 5s.
func defaultBackoff(n int) time.Duration { return core.DefaultBackoff(n) }
