package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/keylane/keylane/internal/sale"
)

// Contender is one way to run a flash sale. The harness calls Setup with a
// server configuration, Run once, then Teardown, for every run; Teardown
// must also undo a Setup that failed half-way.
type Contender interface {
	Name() string
	Kind() Kind
	Setup(ctx context.Context, env Env) error
	Run(ctx context.Context, w Workload) (Result, error)
	Teardown(ctx context.Context)
}

// Kind says how a contender is ranked.
type Kind int

const (
	// Keylane is keylane itself.
	Keylane Kind = iota
	// Peer is a lock-based way to do the same job: the rows keylane is
	// ranked against.
	Peer
	// Limit is a ceiling, not a peer: the fastest a family of designs can
	// go, without the guarantees.
	Limit
)

// Placement says where the NATS server runs.
type Placement string

const (
	// Separate runs a nats-server process; keylane's workers and the raw
	// consumer run in a child process.
	Separate Placement = "separate"
	// Embedded runs the server, the workers and the consumer inside the
	// bench process.
	Embedded Placement = "embedded"
	// Cluster runs three nats-server processes routed into one cluster,
	// keylane's objects at 3 replicas over Config.StreamShards jobs
	// streams, and the workers in a child process. Only keylane's rows
	// run there, and not the durable workload.
	Cluster Placement = "cluster"
)

// Env is the server configuration of one run.
type Env struct {
	// Placement of NATS. Redis contenders ignore it: redis-server always
	// runs as its own process.
	Placement Placement
	// Durable makes every server fsync each write before acknowledging it:
	// NATS sync_interval always, Redis appendfsync always.
	Durable bool
	// Hold is the simulated I/O inside the critical section.
	Hold time.Duration
	// Exe is this program; the separate placement runs it with the hidden
	// subcommands "worker" and "rawjs".
	Exe string
	// NATSServer is the nats-server binary of the separate and cluster
	// placements.
	NATSServer string
	// StreamShards is the number of jobs streams in the cluster placement.
	StreamShards int
	// SpreadLeaders moves the shards' stream leaders onto different nodes
	// in the cluster placement.
	SpreadLeaders bool
	// Progress receives notes on the run (where the leaders are, each
	// node's CPU).
	Progress io.Writer
}

// Workload is one flash sale: buyers racing for the stock of SKUs.
type Workload struct {
	// Name is the family: hot, skewed or slow.
	Name   string
	Buyers int
	// SKUs on sale; demand over them is Zipf-distributed with Skew when
	// there are more than one.
	SKUs int
	Skew float64
	// Stock of each SKU at the start.
	Stock int64
	// Hold is simulated I/O inside the critical section of every purchase.
	Hold time.Duration
	// Durable runs the servers with fsync on every write.
	Durable bool
	// Purchases and Duration bound a run, whichever comes first.
	Purchases int
	Duration  time.Duration
}

// Label names the workload in the table.
func (w Workload) Label() string {
	s := fmt.Sprintf("%s b=%d", w.Name, w.Buyers)
	if w.Durable {
		s += " fsync"
	}
	return s
}

// picks returns the SKU of every purchase, drawn as sale.Run draws them,
// so every contender sees the same sequence.
func (w Workload) picks() []int { return sale.Picks(w.Purchases, w.SKUs, w.Skew, false) }

// Result is the outcome of one run.
type Result struct {
	// Jobs is how many purchases ran in the timed part, Elapsed how long
	// it took (fire-and-forget: until the last one was applied).
	Jobs    int
	Elapsed time.Duration
	// P50 and P99 are purchase latencies; zero without replies.
	P50, P99 time.Duration
	// Calls is lock API calls per purchase; zero when not a lock.
	Calls  float64
	Sold   int64
	Failed int64
	// Oversold counts units sold beyond stock or demand; Lost counts sales
	// whose decrement is missing; Mismatch counts decrements without a sale.
	Oversold, Lost, Mismatch int64
	FirstErr                 string
	// Server and Worker are the usage of the server process and of the
	// worker process (embedded: the whole bench process) in the timed part.
	Server, Worker usage
	// Client is the bench process's own usage (the buyers) when the worker
	// runs elsewhere; zero in the embedded placement.
	Client usage
	Err    error // the run did not complete
}

// Rate returns purchases per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Jobs) / r.Elapsed.Seconds()
}

// Check returns "ok" or what broke, worst first.
func (r Result) Check() string {
	switch {
	case r.Err != nil:
		return "ERROR"
	case r.Oversold > 0:
		return fmt.Sprintf("OVERSOLD %d", r.Oversold)
	case r.Lost > 0:
		return fmt.Sprintf("LOST %d", r.Lost)
	case r.Mismatch > 0:
		return fmt.Sprintf("MISMATCH %d", r.Mismatch)
	case r.Failed > 0:
		return fmt.Sprintf("FAILED %d", r.Failed)
	}
	return "ok"
}
