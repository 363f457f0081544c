package keylanepg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane"
)

// Applier is keylane's GroupApplier for PostgreSQL: a worker with
//
//	keylane.WorkerConfig{Applier: &keylanepg.Applier{DB: pool, Handler: shop.Sell}}
//
// hands each key's queued jobs to Apply as one group, under its
// partition's fence, and replies to and acks each job once its outcome
// committed. Applied and Recorded jobs are Done; a Failed job is retried
// or dead-lettered by the worker with its Err; a Held one runs again after
// the job that held it. A StaleFenceError steps the worker's owner down.
type Applier struct {
	// DB is the database: a *pgxpool.Pool, typically.
	DB DB
	// Handler applies one job inside the group's transaction; or
	// Pipeline queues its statements, sent with the group's others in one
	// round trip (PipelineHandler); or Set reads and writes the
	// transaction's jobs together, a few statements for all of them
	// (SetHandler). Set exactly one.
	Handler  Handler
	Pipeline PipelineHandler
	Set      SetHandler
	// IdleTimeout, if set, is Apply's IdleTimeout: set it below the lease
	// TTL, so a paused owner's transaction does not hold its successor
	// for longer than that.
	IdleTimeout time.Duration
	// MaxJobs caps the jobs of one transaction: a larger group (a hot
	// key's queue, the joined groups of several keys) is applied in
	// several transactions of at most MaxJobs jobs, one after another in
	// the group's order. Every job runs in a savepoint, and PostgreSQL
	// keeps the IDs of only 64 subtransactions that wrote per transaction
	// in shared memory; past that, every other session's snapshot gets
	// slower while the transaction runs. Negative: no cap.
	// Defaults to DefaultMaxJobs.
	MaxJobs int
	// Retention is how long keylane_outcomes keeps a job's outcome: the
	// worker prunes older ones now and then (keylane.RecordPruner), in
	// small batches. keylane's Start refuses one shorter than a job can
	// come back (keylane.MinRecordRetention: the results TTL, the
	// duplicate window, redeliveries), and no prune deletes the outcome
	// of a job that may still be in the jobs streams. A retry by job ID
	// after it is applied again. Negative: the worker never prunes (call
	// Prune yourself). Defaults to DefaultRetention.
	Retention time.Duration
}

// DefaultRetention is Applier's default Retention: a day. At 10,000 jobs
// a second that keeps some 860 million outcomes (about 1 GB each 8
// million at the shop's sizes: see "Keeping outcomes" in the package doc).
const DefaultRetention = 24 * time.Hour

// DefaultMaxJobs is Applier's default cap on the jobs of one transaction:
// PostgreSQL's cache of subtransaction IDs per transaction
// (PGPROC_MAX_CACHED_SUBXIDS), so that a group never overflows it.
const DefaultMaxJobs = 64

// Validate reports what is wrong with a's configuration: a DB, and
// exactly one of Handler, Pipeline and Set. keylane.NewWorker calls it
// and refuses an Applier it fails, so a worker never starts to hold its
// first jobs on a refusal for good.
func (a *Applier) Validate() error {
	n := 0
	for _, set := range []bool{a.Handler != nil, a.Pipeline != nil, a.Set != nil} {
		if set {
			n++
		}
	}
	if a.DB == nil || n != 1 {
		return errors.New("keylanepg: Applier needs a DB, and a Handler, a Pipeline or a Set (one of them)")
	}
	return nil
}

// ApplyGroup applies g through Apply and maps its outcomes.
func (a *Applier) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	if err := a.Validate(); err != nil {
		return nil, keylane.Permanent(err)
	}
	cfg := applyOpts{idle: a.IdleTimeout}
	limit := a.MaxJobs
	switch {
	case limit == 0:
		limit = DefaultMaxJobs
	case limit < 0:
		limit = len(g.Jobs)
	}
	if _, err := checkGroup(Group{Namespace: g.Namespace, Partition: g.Partition, Fence: g.Fence, Jobs: g.Jobs}); err != nil {
		// A group no retry makes valid: held and said at ERROR.
		return nil, keylane.Permanent(err)
	}
	res := make([]keylane.JobOutcome, len(g.Jobs))
	// A key that failed retriably in one transaction holds its later jobs
	// in the next ones too: they keep their order. A transaction that
	// fails fails the call, whatever the ones before it committed: the
	// worker applies the group again, and the record answers those.
	held := make(map[string]bool)
	for lo := 0; lo < len(g.Jobs); lo += limit {
		jobs := g.Jobs[lo:min(lo+limit, len(g.Jobs))]
		grp := Group{Namespace: g.Namespace, Partition: g.Partition, Fence: g.Fence, Jobs: jobs}
		var out []Outcome
		var err error
		switch {
		case a.Pipeline != nil:
			out, err = applyPipeline(ctx, a.DB, grp, a.Pipeline, cfg, held)
		case a.Set != nil:
			out, err = applySet(ctx, a.DB, grp, a.Set, cfg, held)
		default:
			out, err = apply(ctx, a.DB, grp, a.Handler, cfg, held)
		}
		if err != nil {
			return nil, wholeError(err)
		}
		for i, o := range out {
			switch o.Status {
			case Applied, Recorded:
				res[lo+i] = keylane.JobOutcome{Result: o.Result, Done: true}
			case Failed:
				res[lo+i] = keylane.JobOutcome{Err: o.Err}
			}
		}
	}
	return res, nil
}

var (
	_ keylane.GroupApplier = (*Applier)(nil)
	_ keylane.RecordPruner = (*Applier)(nil)
)

// RecordRetention is Retention, DefaultRetention if zero: keylane's
// worker prunes outcomes older than it (keylane.RecordPruner).
func (a *Applier) RecordRetention() time.Duration {
	if a.Retention == 0 {
		return DefaultRetention
	}
	return a.Retention
}

// PruneRecord is Prune on a's DB: keylane's worker calls it now and then.
func (a *Applier) PruneRecord(ctx context.Context, namespace string, before time.Time) (int64, error) {
	if a.DB == nil {
		return 0, errors.New("keylanepg: Applier has no DB")
	}
	return Prune(ctx, a.DB, namespace, before)
}

// ReadRecord returns the recorded results of the jobs of namespace with
// the given IDs, keyed by ID (Lookup's): keylane's worker reads a job's
// record before it dead-letters the job, and answers one that committed
// from it instead.
func (a *Applier) ReadRecord(ctx context.Context, namespace string, ids []string) (map[string][]byte, error) {
	if a.DB == nil {
		return nil, errors.New("keylanepg: Applier has no DB")
	}
	rec, err := Lookup(ctx, a.DB, namespace, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(rec))
	for id, o := range rec {
		out[id] = o.Result
	}
	return out, nil
}

// wholeError marks err, a whole group's failure, for the worker.
func wholeError(err error) error {
	switch {
	case errors.Is(err, keylane.ErrStaleFence):
		return err
	case operatorsToFix(err):
		// keylane's own statements refused for what they are: the worker
		// holds the jobs and says so at ERROR, never dead-letters them
		// for it (see "With a keylane worker").
		return keylane.Permanent(err)
	case unavailable(err):
		// Not the jobs' doing: the worker never counts it.
		return fmt.Errorf("%w: %w", keylane.ErrUnavailable, err)
	}
	return err
}

// unavailable reports whether err, a whole group's failure, says the
// database was not there to answer rather than that it refused the
// group: no answer from the server (a connection refused, broken or cut,
// a timeout, the caller's deadline), or the server's own SQLSTATE class 08
// (connection exception), 57 (operator intervention: shutting down,
// starting up), 53 (insufficient resources), 58 (system error) or 40
// (a serialization failure or a deadlock with another session). The
// worker tries such a group again for as long as it lasts, and counts
// any other failure against the job (keylane.ErrUnavailable).
func unavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	switch pe.Code[:2] {
	case "08", "57", "53", "58", "40":
		return true
	}
	return false
}

// operatorsToFix reports whether err, a whole group's failure, is a
// refusal that no retry cures until an operator acts: SQLSTATE class 42
// (an undefined table, a privilege revoked), 3F (a schema gone), 28 (the
// role may not log in) or 0A (a feature the server lacks). Connection
// failures, shutdowns, serialization failures and deadlocks are not, nor
// is 0A000 "cached plan must not change result type" (a table altered
// under a prepared statement): pgx drops the statement from its cache on
// it, so the next try prepares it again and passes.
func operatorsToFix(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	if pe.Code == "0A000" && strings.Contains(pe.Message, "cached plan must not change result type") {
		return false
	}
	switch pe.Code[:2] {
	case "42", "3F", "28", "0A":
		return true
	}
	return false
}
