package keylane

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Topology names the namespace and, for the first worker, how to create
	// it. See TopologyConfig for its defaults.
	Topology TopologyConfig
	// Handler runs the jobs. Exactly one of Handler, Reducer and Applier
	// is required.
	Handler Handler
	// Reducer runs the jobs as pure updates of their key's state, which the
	// worker keeps and group-commits (see Reducer). It is the fast path:
	// one state write per group of a key's queued jobs instead of per job.
	Reducer Reducer
	// Applier applies the jobs to the user's database, a key's queued jobs
	// in one transaction that also records their outcomes and checks the
	// partition's fence (see GroupApplier; keylanepg is one for
	// PostgreSQL). Exactly once then rests on the database's record.
	// NewWorker refuses one whose Validate method (if it has one) fails.
	Applier GroupApplier
	// ID names this worker in the members bucket, on lease entries and on
	// dead letters. Defaults to "<hostname>-<pid>-<random>". Letters,
	// digits, '_' and '-' only.
	ID string
	// Concurrency is how many different keys of one partition may run at
	// once: the handler (or reducer) never runs more than this many jobs
	// of a partition at once, retries included. Jobs of one key never run
	// at the same time whatever this is. A key whose head job waits out a
	// retry's backoff does not count: its runner steps aside meanwhile,
	// and waits for a free place once the backoff is over (see
	// jetstream/doc.go, "A failing key does not hold its partition").
	// Defaults to 8 (DefaultConcurrency), and to 64 with an Applier
	// (DefaultApplierConcurrency): an Applier joins the groups of the
	// keys that are ready while a transaction is in flight into the next
	// one, and this caps how many keys that is; with many keys a key's
	// group is often one job, so 8 would cap a transaction at 8 jobs.
	Concurrency int
	// MaxInFlight is how many fetched, unfinished jobs one partition holds
	// in memory, whatever batch message they came in, not counting the
	// head job of each key that retries it (one per failing key). The
	// partition fetches its next message only while it holds fewer, so a
	// batch of several may take it past MaxInFlight by its own jobs (at
	// most wire.MaxBatchJobs). A failing key keeps at most
	// min(16, MaxInFlight/2) of its jobs that came alone (a batch of one)
	// and hands them back when the window is full and no other job can
	// free a place. A job of a batch of several cannot be handed back (a
	// message is acked or NAKed whole): when only such jobs of failing
	// keys hold a full window, the partition fetches its next message
	// anyway, so a healthy key's jobs still run; those held jobs are then
	// bounded by MaxPending's messages, not by MaxInFlight. Defaults to
	// 1024.
	MaxInFlight int
	// MaxPending is the partition's window on the server (the consumer's
	// MaxAckPending): jobs delivered and not acked, including a failing
	// key's retrying head and the jobs it handed back. It must exceed
	// MaxInFlight. Other keys of the partition keep their share of the
	// in-flight window until the failing keys have MaxPending−MaxInFlight
	// jobs, their retrying heads included, handed back or retrying.
	// Defaults to 16×MaxInFlight.
	MaxPending int
	// MaxDeliver is how many times a failing job runs before it is moved to
	// the dead-letter stream. It is the namespace's: the first worker fixes
	// it in the jobs stream's metadata, and a worker configured with
	// another is refused with ErrMaxDeliverMismatch. Zero means "whatever
	// the namespace has", and 5 when no worker fixed it yet. Defaults to 0.
	MaxDeliver int
	// Backoff returns the pause before attempt n+1 after attempt n failed.
	// Defaults to 50ms doubling per attempt, at most 5s.
	Backoff func(attempt int) time.Duration
	// AckWait is how long the server waits for an ack before redelivering.
	// Jobs that wait or run longer are kept alive with InProgress every
	// AckWait/3. Defaults to 30s.
	AckWait time.Duration
	// SafetyMargin is subtracted from the lease TTL to get the trust window.
	// Defaults to LeaseTTL/10.
	SafetyMargin time.Duration
	// StoreResults stores every job's result in the results bucket before
	// replying, so a caller can fetch a result it missed and a redelivered
	// job returns its stored result instead of running again. Defaults to
	// false.
	StoreResults bool
	// OutcomeBatch is the fewest outcomes kept in the results bucket as
	// one JetStream atomic batch (one ack, one fsync, one replicated
	// proposal) instead of one put and ack each: a group's, with those of
	// the partition's other groups that finish while a keep is in flight
	// (a catalog's groups are one job each); negative never batches. Zero picks by the namespace's replicas: 2 when
	// replicated (the server stages a batch in memory), never on one
	// replica, where nats-server stages each batch in a store of its own
	// on disk with fsyncs of its own, which pays only on a server that
	// fsyncs every write (sync_interval: always) and for batches of about
	// 16 or more (depending on the disk): set SyncAlwaysOutcomeBatch there. See
	// jetstream/doc.go, "Kept outcomes in one batch". Defaults to 0.
	OutcomeBatch int
	// StateBatch coalesces the state writes (compare-and-sets) of a
	// partition's keys whose groups finish while another of its writes is
	// in flight into one JetStream atomic batch: one request, one ack,
	// one replicated proposal; a lone write still goes at once, alone.
	// Positive turns it on; zero or negative leaves it off. Off by
	// default because the bench showed it did not pay: on one replica
	// nats-server stages each atomic batch in a file store of its own
	// (skewed Call five times slower), and on the three-node bench cluster
	// it was slightly slower too. See jetstream/doc.go, "State writes of
	// several keys in one batch". Defaults to 0.
	StateBatch int
	// TracerProvider turns tracing on: each job gets a consumer span,
	// child of the span its Submit or Call sent in the job's headers, with
	// child spans for its queue wait, each run (the context passed to the
	// Handler or Reducer carries it) and its commit (see the package doc,
	// "Tracing"). Defaults to nil: no span, no header read, nothing
	// allocated per job. The global provider is never used unless passed
	// here.
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from job headers. Defaults to
	// W3C Trace Context (propagation.TraceContext{}). Used only with a
	// TracerProvider.
	Propagator propagation.TextMapPropagator
	// Logger receives the worker's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Observer receives the worker's measurements (queue wait, run time,
	// group size, end-to-end latency, lease renews) for metrics; see
	// package metrics. Defaults to nil: nothing is measured, at no cost.
	Observer *WorkerObserver
}

var workerIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

var notIDChar = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// DefaultWorkerID returns "<hostname>-<pid>-<random>", with characters a
// worker ID may not hold replaced by '_'. It differs on every call.
func DefaultWorkerID() string {
	host, _ := os.Hostname()
	return notIDChar.ReplaceAllString(host, "_") + "-" + strconv.Itoa(os.Getpid()) + "-" + nuid.Next()[16:]
}

func (c *WorkerConfig) setDefaults() error {
	if n := btoi(c.Handler != nil) + btoi(c.Reducer != nil) + btoi(c.Applier != nil); n != 1 {
		return fmt.Errorf("keylane: WorkerConfig needs exactly one of Handler, Reducer and Applier (%d set)", n)
	}
	if v, ok := c.Applier.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("keylane: WorkerConfig.Applier: %w", err)
		}
	}
	if err := c.Topology.setDefaults(); err != nil {
		return err
	}
	if c.ID == "" {
		c.ID = DefaultWorkerID()
	}
	if !workerIDRE.MatchString(c.ID) {
		return fmt.Errorf("keylane: worker ID %q must match %s", c.ID, workerIDRE)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
		if c.Applier != nil {
			c.Concurrency = DefaultApplierConcurrency
		}
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	// MaxDeliver 0 follows the namespace's: Start sets it from there.
	c.Topology.maxDeliver = c.MaxDeliver
	if c.MaxDeliver == 0 {
		c.Topology.maxDeliver = -1
	}
	if c.MaxPending == 0 {
		c.MaxPending = 16 * c.MaxInFlight
	}
	if c.MaxPending <= c.MaxInFlight {
		// The server's window holds a failing key's retrying head (which
		// the in-flight window does not count) and what it hands back:
		// with no room beyond MaxInFlight that key could hold its
		// partition (promise 8).
		return fmt.Errorf("keylane: MaxPending %d must exceed MaxInFlight %d: a failing key's retrying head and the jobs it hands back need room beyond the in-flight window", c.MaxPending, c.MaxInFlight)
	}
	if c.Concurrency < 1 || c.MaxInFlight < 1 || c.MaxDeliver < 0 {
		return errors.New("keylane: Concurrency, MaxInFlight and MaxDeliver must be positive")
	}
	if c.Backoff == nil {
		c.Backoff = defaultBackoff
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.AckWait < MinAckWait {
		return fmt.Errorf("keylane: AckWait %s is below %s", c.AckWait, MinAckWait)
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.Topology.LeaseTTL / 10
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// Stats counts what a worker did. All fields are totals since start.
type Stats struct {
	Runs         int64 // handler invocations, retries included
	Succeeded    int64 // jobs acked after success
	Failed       int64 // handler errors (each retried or dead-lettered)
	DeadLettered int64 // jobs moved to the dead-letter stream
	Malformed    int64 // messages on our subjects that were not valid jobs
	Stale        int64 // jobs abandoned because a newer fence had written
	Unacked      int64 // finished jobs not acked because the lease was not trusted
	FromResults  int64 // redelivered jobs answered from the results bucket
	Acquired     int64 // partition leases acquired
	Lost         int64 // partition leases lost (not released)
	Released     int64 // partition leases released gracefully
	// Owned counts the partitions owned now (Worker.Owned): those whose
	// lease is still trusted, not those whose owner winds down after its
	// lease's trust window closed without a renew (a NATS outage).
	Owned int64
	// Resyncs counts re-synchronisations of a partition's delivery (a gap
	// in the consumer's delivery sequence, a reconnect, missed heartbeats).
	Resyncs int64
	// Gaps counts jobs refused because a later job of their key had been
	// applied and their own outcome was not held (ErrGap); each was
	// dead-lettered, never answered as a success.
	Gaps int64
	// ApplierRefusals counts attempts an Applier refused for good (its
	// error errors.Is ErrPermanent: a table dropped, a privilege revoked):
	// the job is held, never dead-lettered for it, and said at ERROR. Not
	// zero means an operator must act.
	ApplierRefusals int64
	// DeadLetterErrors counts failed attempts to write a dead letter; the
	// job stays in its lane, unacked, until one succeeds.
	DeadLetterErrors int64
	// HandedBack counts jobs handed back to the server: a stalled key's,
	// and jobs waiting behind a key's gap when they filled the in-flight
	// window (Tenure.HandedBack is how many are out now).
	HandedBack int64
	// Stuck counts owners whose handlers kept running after the lease was
	// lost; the worker steps aside as the partition's desired owner until
	// they return.
	Stuck int64
	// RenewFailures counts lease renew attempts that failed (timeout,
	// conflict, disconnect), of partition and member leases: counted with
	// or without an Observer.
	RenewFailures int64
}

type stats struct {
	tenure.Stats                   // the tenures'
	acquired, stuck, renewFailures atomic.Int64
}

// The API of what a worker runs and reports to; internal/core's, where
// each is documented.
type (
	Reducer                 = core.Reducer
	ReducerFunc             = core.ReducerFunc
	CommitObserver          = core.CommitObserver
	UncertainCommitObserver = core.UncertainCommitObserver
	GroupApplier            = core.GroupApplier
	RecordReader            = core.RecordReader
	RecordPruner            = core.RecordPruner
	JobGroup                = core.JobGroup
	JobOutcome              = core.JobOutcome
	WorkerObserver          = core.WorkerObserver
)

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
