package namespace

import (
	"strconv"
	"strings"
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

// Delays is the stream of delayed jobs' schedules and due copies, e.g.
// KEYLANE_DELAYS (only on a namespace with delays).
func (n Names) Delays() string { return n.upper() + "_DELAYS" }

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
