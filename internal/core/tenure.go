package core

import (
	"context"
	"time"
)

// What a worker's tenure of a partition runs and reports to
// (internal/tenure): the Reducer and the GroupApplier besides the
// Handler, their optional interfaces, and the WorkerObserver. Package
// keylane re-exports each under its own name.

// Reducer computes a key's next state and a job's result from the job and
// the key's current state (nil if never written), with no other side
// effect. It must not modify state; it returns a new slice.
//
// A worker with a Reducer keeps each key's state itself, in the namespace's
// state bucket (read it with State.Get), and group-commits: it reduces the
// queued jobs of a key one after another in memory, stores the outcome with
// one compare-and-set carrying the last job's sequence, the fence and every
// job's result, and only then replies to and acks each job. A hot key with
// 64 waiting buyers thus costs one state write per 64 jobs, not 64.
//
// Because a Reducer has no side effect, running it again is harmless: it
// may run again for the same job when a group's write failed, or under a
// new owner when the old one died before its write landed. Only the run
// whose write landed has effect, and a job that a landed write covers is
// answered from the stored result without running again.
//
// An error is retried in place with backoff; wrap it with Permanent to
// dead-letter at once. The jobs grouped before a failing one are committed
// first, so a failure never reorders or holds back the key's other jobs
// beyond its own retries.
type Reducer interface {
	Reduce(ctx context.Context, job Job, state []byte) (next, result []byte, err error)
}

// ReducerFunc adapts a function to Reducer.
type ReducerFunc func(ctx context.Context, job Job, state []byte) (next, result []byte, err error)

// Reduce calls f.
func (f ReducerFunc) Reduce(ctx context.Context, job Job, state []byte) ([]byte, []byte, error) {
	return f(ctx, job, state)
}

// CommitObserver is an optional interface of a Reducer: after every reduce
// run, Committed tells whether that run's outcome was stored (applied) or
// discarded (its group's write failed, the reduce failed, or the lease was
// lost first). Tests and tracing use it to count effects per job.
type CommitObserver interface {
	Committed(job Job, applied bool)
}

// UncertainCommitObserver is an optional extension of CommitObserver: a
// Reducer that has it is told CommitUncertain, instead of Committed(job,
// false), for a run whose group's write failed with an outcome nobody
// knows: the request was cancelled or timed out (the lease's trust ended
// under it, a slow server), so the write may have landed, and a
// redelivery then finds the job held and answers it without a run. A
// history checker counts such a run as possibly applied.
type UncertainCommitObserver interface {
	CommitUncertain(job Job)
}

// GroupApplier applies a key's queued jobs to a database of the user's,
// in one transaction that it opens and commits (or several, one after
// another in the group's order, when the group is larger than one should
// be), recording each job's outcome in the same transaction as its writes
// (job ID → result) and refusing to commit under a fence older than one
// that has committed. Package keylanepg (module
// github.com/keylane/keylane/pg) is one, for PostgreSQL.
//
// A worker with an Applier groups a key's queued jobs as it does for a
// Reducer, joins the groups of the partition's keys that are ready at the
// same time, and calls ApplyGroup with the partition's fence (the lease's
// fencing token), then replies to and acks each job whose outcome is Done.
// Exactly once rests on the database's record, not on the worker: a job
// redelivered after a crash between the commit and the ack, or submitted
// again with the same ID, comes back to ApplyGroup, which must answer it
// from the record (Done, its recorded Result) without applying it again.
//
// ApplyGroup returns one outcome per job, in g.Jobs' order, or an error:
//   - an error that errors.Is ErrStaleFence: a newer owner of the
//     partition has committed; the refused transaction wrote nothing
//     (earlier transactions of the group may have committed: the record
//     answers their jobs), and the worker steps down at once;
//   - any other error: a transaction failed or its commit's fate is
//     unknown (earlier transactions of the group may have committed).
//     The worker neither replies nor acks, and applies the group's first
//     job again, alone, with backoff (the record tells what did commit;
//     the other jobs go back to their lanes). An error that is
//     ErrPermanent (an operator's to fix: a table dropped) holds the job
//     for as long as the lease lasts; so does one that errors.Is
//     ErrUnavailable (the database is not there to answer). Any other
//     counts: past MaxDeliver
//     such calls with the job alone, an Applier that is a RecordReader
//     and answers the record's read (the database is up) has the job
//     answered from the record if it committed, else dead-lettered for
//     good; a record it cannot read (the database down), or an Applier
//     with none, keeps the job trying, never dead-lettered on a guess.
//
// An Applier that has a configuration to check implements
// Validate() error (keylanepg.Applier does): NewWorker calls it and
// refuses the worker with its error, so a misconfiguration is an error at
// start, not a worker that takes partitions and then holds every job on
// a refusal for good (TestWorkerRefusesAMisconfiguredApplier, in
// keylanepg).
type GroupApplier interface {
	ApplyGroup(ctx context.Context, g JobGroup) ([]JobOutcome, error)
}

// RecordReader is a GroupApplier that can read its database's record of
// applied jobs: ReadRecord returns the recorded result of each of ids
// (of namespace) that committed, keyed by ID; an ID never applied is
// absent. A worker whose Applier is one reads a job's record before it
// dead-letters the job, for any reason (its restart counter past
// MaxDeliver, a failure out of attempts or for good): a job the record
// says is done is answered and acked with its recorded result instead,
// never told "failed" for a commit the database holds. A record it cannot
// read holds the job, tried again with backoff while the tenure lasts.
// keylanepg.Applier is one.
type RecordReader interface {
	ReadRecord(ctx context.Context, namespace string, ids []string) (map[string][]byte, error)
}

// JobGroup is the jobs ApplyGroup applies in one transaction: queued jobs
// of one or several keys of the partition, each key's in stream order
// (keys may follow one another; a key's jobs are together). A failing job
// must not stop the other keys' jobs.
type JobGroup struct {
	Namespace string
	Partition int
	// Fence is the fencing token of the partition's owner: it only grows
	// across owners. The database must refuse a group whose fence is older
	// than one it has committed for the partition.
	Fence uint64
	Jobs  []Job
}

// JobOutcome is what became of one job of a group.
//
//   - Done: the job's effect and its outcome are committed (now, or by an
//     earlier transaction: then Result is the recorded one). The worker
//     replies Result and acks the job.
//   - not Done, Err set: the job failed and its writes were rolled back
//     alone. It is retried with backoff like a Handler's failure, or
//     dead-lettered when errors.Is(Err, ErrPermanent) or out of attempts.
//   - not Done, Err nil: held, not run (an earlier job of its key failed
//     retriably); it runs again after that one.
type JobOutcome struct {
	Result []byte
	Err    error
	Done   bool
}

// RecordPruner is a RecordReader whose record the worker prunes: every
// worker deletes, now and then, the outcomes older than the Applier's
// RecordRetention, so the record does not grow for ever
// (keylanepg.Applier is one; its Retention defaults to a day).
//
// An outcome must outlive every way its job can still come back to the
// Applier, or the job is applied again:
//
//   - a redelivery of the unacked job: after its commit, each owner that
//     dies before the ack costs a lease TTL and an ack wait, and past
//     MaxDeliver restarts the record is read before the job is
//     dead-lettered: (MaxDeliver+2) × (AckWait + LeaseTTL) bounds it while
//     the partitions are owned;
//   - the same job ID submitted again: the jobs stream drops it within
//     the duplicate window; the results bucket answers it for ResultsTTL.
//
// Start refuses a RecordRetention shorter than the longest of these
// (MinRecordRetention), with an error that errors.Is ErrRecordRetention.
// And a job that stays unacked for longer (no worker, or a database that
// refuses every transaction, for that long) keeps its outcome all the
// same: a prune never deletes an outcome recorded after the oldest job
// still in the jobs streams was published (less a minute for the clocks
// of NATS and the database): such a job may yet come back. A retry by
// job ID after the retention is applied again.
//
// RecordRetention 0 means the Applier's default; negative, no pruning by
// the worker (the record is then the user's to prune).
type RecordPruner interface {
	RecordReader
	RecordRetention() time.Duration
	// PruneRecord deletes namespace's outcomes recorded before before and
	// returns how many. It must not stall the Applier's transactions
	// meanwhile (keylanepg deletes in small batches by an index).
	PruneRecord(ctx context.Context, namespace string, before time.Time) (int64, error)
}

// WorkerObserver receives a worker's measurements as they happen, for
// metrics; package metrics turns them into Prometheus histograms. Set it
// in WorkerConfig.Observer. Every field is optional.
//
// The functions run on the job path, from many goroutines at once: they
// must be safe for concurrent use, quick, and must not block. A worker
// with no Observer reads no clock and allocates nothing for measuring.
//
// Durations that start at a job's publish time compare the server's
// timestamp of the stored job with this machine's clock: clock skew
// between the two shows in them, and a negative one is reported as 0.
type WorkerObserver struct {
	// QueueWait is called when this worker takes a delivered job to run it
	// the first time, with the time since the jobs stream stored it. A job
	// handed back while its key retries, or redelivered to a new owner, is
	// a new delivery and is measured again.
	QueueWait func(partition int, wait time.Duration)
	// Run is called after every run: one handler attempt, or one reducer
	// group (its reduce calls and its state write together), with how long
	// it took.
	Run func(partition int, took time.Duration)
	// Group is called after a reducer group's state write landed, with the
	// number of jobs it settled (at least 1). Over a run of jobs the sizes
	// add up to the jobs committed through groups.
	Group func(partition, jobs int)
	// Settled is called once a job's outcome is final here: kept, replied
	// and acked, a success or a dead letter. latency is the time since the
	// jobs stream stored it (end to end). A job whose ack did not go out
	// (the lease was no longer trusted) is not settled here.
	Settled func(partition int, latency time.Duration)
	// LeaseRenewed is called after every renew attempt of the worker's
	// leases (its partitions and its member entry) with the round trip and
	// the attempt's error (nil: the renew landed). It runs on the lease's
	// watchdog goroutine.
	LeaseRenewed func(took time.Duration, err error)
}
