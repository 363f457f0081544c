package keylanepg

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane"
)

// Group is one partition's ready jobs, of one key or several, applied in
// one transaction by Apply.
type Group struct {
	// Namespace is keylane's namespace; fences and outcomes are kept per
	// namespace.
	Namespace string
	// Partition is the partition every job belongs to.
	Partition int
	// Fence is the fencing token of the partition's owner: it only grows
	// across owners, and must be at most math.MaxInt64 (a bigint).
	Fence uint64
	// Jobs are the jobs, each key's in its order (keys may interleave).
	// Apply hands each to the Handler with Partition and Fence set to the
	// group's.
	Jobs []keylane.Job
}

// Status is what became of one job of a group.
type Status int

const (
	// Applied: the Handler ran, and its writes and outcome committed with
	// the group.
	Applied Status = iota + 1
	// Recorded: an earlier transaction had applied the job (a redelivery,
	// or the same ID twice); the Handler did not run, and Result, Fence and
	// At are the recorded ones.
	Recorded
	// Failed: the Handler returned Err; its writes were rolled back alone
	// and nothing is recorded. Retry it unless errors.Is(Err, keylane.ErrPermanent).
	Failed
	// Held: not run, because an earlier job of its key failed retriably in
	// this group; running it would reorder the key. Nothing is recorded.
	Held
)

func (s Status) String() string {
	switch s {
	case Applied:
		return "applied"
	case Recorded:
		return "recorded"
	case Failed:
		return "failed"
	case Held:
		return "held"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Outcome is what became of one job.
type Outcome struct {
	JobID  string
	Key    string
	Status Status
	// Result is the job's result when Applied or Recorded.
	Result []byte
	// Err is the Handler's error when Failed.
	Err error
	// Fence and At are the fence the job was applied under and the
	// applying transaction's start time, when Applied or Recorded.
	Fence uint64
	At    time.Time
}

// Done tells whether the job's effect is committed (Applied or Recorded):
// its result may be replied and the job acked.
func (o Outcome) Done() bool { return o.Status == Applied || o.Status == Recorded }

// SQL of the protocol. The fence statement takes the partition's fence row
// lock and keeps it to the end of the transaction; it returns no row when a
// newer fence has committed. An owner's transactions thus serialize on the
// row, and a deposed owner's fail once its successor's first commit is in.
const (
	fenceSQL = `INSERT INTO keylane_fences AS f (namespace, partition, fence) VALUES ($1, $2, $3)
ON CONFLICT (namespace, partition) DO UPDATE SET fence = EXCLUDED.fence WHERE f.fence <= EXCLUDED.fence
RETURNING transaction_timestamp()`
	committedFenceSQL = `SELECT fence FROM keylane_fences WHERE namespace = $1 AND partition = $2`
	// The outcomes look-up probes the primary key once per ID, on any
	// plan: a LATERAL subquery kept apart (OFFSET 0) is a nested loop over
	// the IDs. The plain form (job_id = ANY($2)) let a cached plan scan the
	// whole table, comparing each row with every ID, ever slower as the
	// table grew.
	outcomesSQL = `SELECT o.job_id, o.key, o.fence, o.result, o.at FROM unnest($2::text[]) AS u(id)
CROSS JOIN LATERAL (SELECT k.job_id, k.key, k.fence, k.result, k.at FROM keylane_outcomes k
	WHERE k.job_id = u.id AND k.namespace = $1 OFFSET 0) AS o`
	recordSQL = `INSERT INTO keylane_outcomes (namespace, job_id, key, fence, result, at)
SELECT $1, u.job_id, u.key, $2, u.result, transaction_timestamp() FROM unnest($3::text[], $4::text[], $5::bytea[]) AS u(job_id, key, result)`
	idleSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`
	// checkDeferredSQL checks the deferred constraints (DEFERRABLE
	// INITIALLY DEFERRED, constraint triggers) of what the transaction
	// wrote so far, now instead of at COMMIT, and then puts their mode
	// back: SET CONSTRAINTS in a savepoint that is rolled back keeps the
	// checks' verdict (an error aborts the job's savepoint) but not the
	// mode, so the next job's statements run as they would at any time,
	// and COMMIT checks again. One simple-protocol message: an error
	// skips the rest of it.
	checkDeferredSQL = `SAVEPOINT keylane_check; SET CONSTRAINTS ALL IMMEDIATE; ROLLBACK TO SAVEPOINT keylane_check`
	savepointSQL     = `SAVEPOINT keylane_job`
	releaseSQL       = `RELEASE SAVEPOINT keylane_job`
	nextJobSQL       = releaseSQL + "; " + savepointSQL
	rollbackSQL      = `ROLLBACK TO SAVEPOINT keylane_job`
)

// ApplyOpt is an option of Apply.
type ApplyOpt func(*applyOpts)

type applyOpts struct {
	idle time.Duration
	// checkDeferred has the careful path check every job's deferred
	// constraints at its end (checkDeferredSQL): set once a COMMIT was
	// refused, so that the job that broke one fails alone.
	checkDeferred bool
}

// IdleTimeout has the database end the group's session if it sits idle in
// the transaction longer than d (idle_in_transaction_session_timeout, for
// this transaction only). An owner paused mid-group (a stopped process, a
// long GC) keeps its partition's fence row locked, and so keeps its
// successor waiting, until it resumes; with IdleTimeout the database ends
// it after d, the successor goes on, and the paused owner's transaction is
// rolled back: it fails when it resumes. Set d below the lease's TTL, and
// above the longest pause of a Handler between two of its statements (work
// outside the database counts as idle too).
// Defaults to the server's setting (none, unless configured).
func IdleTimeout(d time.Duration) ApplyOpt { return func(o *applyOpts) { o.idle = d } }

// Apply applies g's jobs through h in one transaction and commits, and
// returns each job's outcome, in g.Jobs' order. In the transaction, in
// order: the partition's fence is set to g.Fence unless a newer one has
// committed (then nothing is written and the error is a *StaleFenceError);
// jobs already recorded are answered from keylane_outcomes and not run
// again; every other job runs in its own savepoint, so a failing one is
// rolled back alone; the applied jobs' outcomes are recorded. See the
// package doc for the protocol and what a crash at each step leaves.
//
// An error other than a stale fence means the transaction failed, or its
// commit's fate is unknown (the connection broke during COMMIT): reply
// nothing and ack nothing; applying the group again, or Lookup, tells. A
// job that failed is reported in its Outcome, not as an error.
func Apply(ctx context.Context, db DB, g Group, h Handler, opts ...ApplyOpt) ([]Outcome, error) {
	return apply(ctx, db, g, h, options(opts), make(map[string]bool))
}

// options applies opts.
func options(opts []ApplyOpt) applyOpts {
	var cfg applyOpts
	for _, opt := range opts {
		opt(&cfg)
	}
	return cfg
}

// apply is Apply, with held the keys whose jobs are not to run (a job of
// theirs failed retriably before): Applier carries it from one
// transaction of a split group to the next, and adds to it.
//
// Two faults of one job end the transaction, not just the job's
// savepoint, and apply settles both in a new one (each at most once per
// job, so the transactions are at most the group's jobs and two):
//   - a job's statement that pgx could not send (it cannot encode an
//     argument, or the server will not prepare the statement) in a batch
//     with other statements: pgx closes the connection, or the server
//     aborts the transaction before the job's savepoint was taken
//     (*poisonError). The job fails with that error — for good when
//     nothing can encode its arguments — and the rest apply again without
//     it;
//   - a COMMIT the server refused (a deferred constraint broken): it
//     rolled back, a known fate. The group applies again with every job's
//     deferred constraints checked at its end (checkDeferredSQL), so the
//     job that broke one fails alone.
func apply(ctx context.Context, db DB, g Group, h Handler, cfg applyOpts, held map[string]bool) ([]Outcome, error) {
	ids, err := checkGroup(g)
	if err != nil {
		return nil, err
	}
	if len(g.Jobs) == 0 {
		return []Outcome{}, nil
	}
	start := maps.Clone(held)
	var poisoned map[int]error
	for range len(g.Jobs) + 2 {
		out, err := applyOnce(ctx, db, g, ids, h, cfg, held, poisoned)
		var pe *poisonError
		switch {
		case ctx.Err() != nil:
			return out, err
		case errors.As(err, &pe) && poisoned[pe.job] == nil:
			if poisoned == nil {
				poisoned = make(map[int]error)
			}
			poisoned[pe.job] = jobError(pe.err)
		case errors.Is(err, errCommitRefused) && !cfg.checkDeferred:
			cfg.checkDeferred = true
		default:
			return out, err
		}
		// The transaction rolled back: the keys it held are as before it.
		clear(held)
		maps.Copy(held, start)
	}
	return nil, errors.New("keylanepg: the group's transactions were undone more often than it has jobs (a bug)")
}

// poisonError is applyOnce's error when job g.Jobs[job] lost the
// transaction with a statement pgx could not send (err): the job fails,
// and the rest of the group applies again without it.
type poisonError struct {
	job int
	err error
}

func (e *poisonError) Error() string {
	return fmt.Sprintf("keylanepg: job %d's statement lost the transaction: %v", e.job, e.err)
}

func (e *poisonError) Unwrap() error { return e.err }

// errCommitRefused is in the error of a transaction whose COMMIT the
// server answered with an error (a deferred constraint broken, a
// serialization failure): the server rolled it back, nothing committed.
// A known fate, unlike a COMMIT that went unanswered.
var errCommitRefused = errors.New("keylanepg: COMMIT refused by the server: the transaction rolled back")

// commitError is the error of a failed COMMIT: a refusal the server
// answered (errCommitRefused: rolled back) or an unknown fate.
func commitError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) || errors.Is(err, pgx.ErrTxCommitRollback) {
		return fmt.Errorf("%w: %w", errCommitRefused, err)
	}
	return fmt.Errorf("keylanepg: commit (%w): %w", errFateUnknown, err)
}

// lostTransaction reports whether err, a job's statement's, says pgx
// could not send it with the others of its batch (pgx.ErrPreprocessingBatch:
// an argument it cannot encode, a statement the server will not prepare):
// that job's fault alone, though it may have cost the transaction.
func lostTransaction(err error) bool {
	var pe pgx.ErrPreprocessingBatch
	return errors.As(err, &pe)
}

// unencodable reports whether err is pgx's refusal to encode a
// statement's arguments (a value that does not fit its parameter's type,
// an argument count that is not the statement's): no retry encodes them.
func unencodable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return false
	}
	var pe pgx.ErrPreprocessingBatch
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Error(), "error preprocessing batch (build)")
	}
	return strings.Contains(err.Error(), "failed to encode args[")
}

// jobError is a failed job's error: for good (keylane.Permanent) when pgx
// cannot encode its arguments, as it is.
func jobError(err error) error {
	if unencodable(err) && !errors.Is(err, keylane.ErrPermanent) {
		return keylane.Permanent(err)
	}
	return err
}

// applyOnce is one transaction of apply: the jobs of poisoned fail with
// their error without running.
func applyOnce(ctx context.Context, db DB, g Group, ids []string, h Handler, cfg applyOpts, held map[string]bool, poisoned map[int]error) ([]Outcome, error) {
	out := make([]Outcome, len(g.Jobs))

	// One round trip: BEGIN, the fence (and its row lock), then — after the
	// lock, so it sees every commit of an earlier owner — the recorded
	// outcomes, then the first job's savepoint.
	recorded := make(map[string]Outcome)
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if cfg.idle > 0 {
		queueIdle(&b, cfg.idle)
	}
	var started time.Time
	fenced := false
	b.Queue(fenceSQL, g.Namespace, g.Partition, int64(g.Fence)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&started)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		fenced = err == nil
		return err
	})
	b.Queue(outcomesSQL, g.Namespace, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var o Outcome
			var fence int64
			if err := rows.Scan(&o.JobID, &o.Key, &fence, &o.Result, &o.At); err != nil {
				return err
			}
			o.Status, o.Fence = Recorded, uint64(fence)
			recorded[o.JobID] = o
		}
		return rows.Err()
	})
	b.Queue(savepointSQL)
	br := db.SendBatch(ctx, &b)
	tx := br.Tx()
	defer rollback(ctx, tx.Rollback)
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("keylanepg: begin, fence and outcomes: %w", err)
	}
	if !fenced {
		return nil, staleFence(ctx, tx, g)
	}

	var (
		dirty   = false // a job's writes sit in the open savepoint
		appIDs  []string
		appKeys []string
		appRes  [][]byte
	)
	for i, job := range g.Jobs {
		if o, ok := recorded[job.ID]; ok {
			out[i] = o
			continue
		}
		if held[job.Key] {
			out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Held}
			continue
		}
		if perr, ok := poisoned[i]; ok {
			out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Failed, Err: perr}
			if !errors.Is(perr, keylane.ErrPermanent) {
				held[job.Key] = true
			}
			continue
		}
		// The savepoint rolls on to this job with its first statement.
		jt := &jobTx{Tx: tx, state: rollDone, jobID: job.ID}
		if dirty {
			jt.state = rollPending
		}
		job.Partition, job.Fence = g.Partition, g.Fence
		res, herr := handle(ctx, jt, job, h)
		if jt.state == rollFailed {
			if lostTransaction(jt.rollErr) {
				// The job's first statement, sent with the roll, could
				// not be: the roll never ran, and the transaction is
				// lost or aborted.
				return nil, &poisonError{job: i, err: jt.rollErr}
			}
			return nil, fmt.Errorf("keylanepg: job %s: %w", job.ID, errors.Join(herr, errSavepoint))
		}
		if herr == nil && cfg.checkDeferred && jt.state == rollDone {
			if _, err := tx.Exec(ctx, checkDeferredSQL); err != nil {
				herr = fmt.Errorf("keylanepg: job %s breaks a deferred constraint: %w", job.ID, err)
			}
		}
		if herr == nil {
			if res == nil {
				res = []byte{} // result is NOT NULL: nil and empty are one
			}
			out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Applied, Result: res, Fence: g.Fence, At: started}
			recorded[job.ID] = Outcome{JobID: job.ID, Key: job.Key, Status: Recorded, Result: res, Fence: g.Fence, At: started}
			appIDs, appKeys, appRes = append(appIDs, job.ID), append(appKeys, job.Key), append(appRes, res)
			dirty = true
			continue
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("keylanepg: job %s: %w", job.ID, errors.Join(herr, ctx.Err()))
		}
		// A job that sent no statement wrote nothing: the open savepoint
		// holds the jobs before it, and stays.
		if jt.state == rollDone {
			if _, err := tx.Exec(ctx, rollbackSQL); err != nil {
				if lostTransaction(herr) {
					// pgx could not send the job's batch, and closed
					// the connection over it.
					return nil, &poisonError{job: i, err: herr}
				}
				return nil, fmt.Errorf("keylanepg: roll back job %s (it failed: %v): %w", job.ID, herr, err)
			}
			dirty = false
		}
		herr = jobError(herr)
		out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Failed, Err: herr}
		if !errors.Is(herr, keylane.ErrPermanent) {
			held[job.Key] = true
		}
	}
	if len(appIDs) > 0 {
		if _, err := tx.Exec(ctx, recordSQL, g.Namespace, int64(g.Fence), appIDs, appKeys, appRes); err != nil {
			return nil, fmt.Errorf("keylanepg: record outcomes: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, commitError(err)
	}
	return out, nil
}

// checkGroup refuses a group Apply cannot apply, and returns its job IDs.
func checkGroup(g Group) ([]string, error) {
	if g.Namespace == "" {
		return nil, errors.New("keylanepg: group without a namespace")
	}
	if g.Fence > math.MaxInt64 {
		return nil, fmt.Errorf("keylanepg: fence %d does not fit a bigint", g.Fence)
	}
	ids := make([]string, len(g.Jobs))
	for i, j := range g.Jobs {
		if j.ID == "" {
			return nil, fmt.Errorf("keylanepg: job %d of the group has no ID", i)
		}
		ids[i] = j.ID
	}
	return ids, nil
}

// queueIdle queues the transaction's idle_in_transaction_session_timeout.
func queueIdle(b *pgx.Batch, d time.Duration) {
	b.Queue(idleSQL, strconv.FormatInt(max(d.Milliseconds(), 1), 10))
}

// errSavepoint is in Apply's error when a job's savepoint could not be
// opened: its failure cannot be rolled back alone.
var errSavepoint = errors.New("keylanepg: the job's savepoint failed: the group is rolled back")

// handle runs h for one job, turning a panic into an error.
func handle(ctx context.Context, tx pgx.Tx, job keylane.Job, h Handler) (res []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylanepg: handler panicked on job %s: %v", job.ID, r)
		}
	}()
	return h.Handle(ctx, tx, job)
}

// rollbackWait bounds the ROLLBACK that ends a transaction which did not
// commit: a server that takes it and never answers must not hold the
// apply, and with it the worker's lane, for ever. Past it pgx closes the
// connection, and the server rolls the transaction back when it sees the
// connection go (TestRollbackIsBounded).
const rollbackWait = 5 * time.Second

// rollback runs end (a transaction's Rollback) on the way out, bounded by
// rollbackWait whether or not ctx has ended (it runs after a cancelled
// ctx too: the transaction must still be ended).
func rollback(ctx context.Context, end func(context.Context) error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackWait)
	defer cancel()
	_ = end(rctx)
}

// staleFence reads the newer fence that refused g, for the error.
func staleFence(ctx context.Context, tx interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, g Group) error {
	e := &StaleFenceError{Namespace: g.Namespace, Partition: g.Partition, Fence: g.Fence}
	var committed int64
	if err := tx.QueryRow(ctx, committedFenceSQL, g.Namespace, g.Partition).Scan(&committed); err != nil {
		return errors.Join(e, fmt.Errorf("keylanepg: read the committed fence: %w", err))
	}
	e.Committed = uint64(committed)
	return e
}

// Lookup returns the recorded outcomes of the jobs of namespace with the
// given IDs (Status Recorded), keyed by job ID; an ID never applied is
// absent. A client retrying a job by ID finds its result here.
func Lookup(ctx context.Context, db DB, namespace string, ids []string) (map[string]Outcome, error) {
	rows, err := db.Query(ctx, outcomesSQL, namespace, ids)
	if err != nil {
		return nil, fmt.Errorf("keylanepg: lookup: %w", err)
	}
	found := make(map[string]Outcome)
	for rows.Next() {
		var o Outcome
		var fence int64
		if err := rows.Scan(&o.JobID, &o.Key, &fence, &o.Result, &o.At); err != nil {
			rows.Close()
			return nil, fmt.Errorf("keylanepg: lookup: %w", err)
		}
		o.Status, o.Fence = Recorded, uint64(fence)
		found[o.JobID] = o
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("keylanepg: lookup: %w", err)
	}
	return found, nil
}

// Prune deletes namespace's outcomes recorded before before, and returns
// how many it deleted (with an error, those it deleted before it). Keep an
// outcome as long as its job may be redelivered or retried by ID (the
// jobs stream's retention and duplicate window): a pruned job that comes
// back is applied again. keylane's worker runs it with an Applier's
// Retention (keylane.RecordPruner), with the bounds that keep it safe.
//
// It deletes in transactions of PruneBatch outcomes each, the oldest
// first, found through the index keylane_outcomes_at (namespace, at):
// no transaction of it holds many row locks or runs long, and it skips
// rows another prune holds (SKIP LOCKED), so workers pruning at once
// share the work; between two it pauses as long as the last took. The
// partitions' transactions never wait for it: they insert new outcomes
// and read others by ID, and MVCC lets them.
func Prune(ctx context.Context, db DB, namespace string, before time.Time) (int64, error) {
	var total int64
	for {
		start := time.Now()
		rows, err := db.Query(ctx, pruneSQL, namespace, before, PruneBatch)
		if err != nil {
			return total, fmt.Errorf("keylanepg: prune: %w", err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("keylanepg: prune: %w", err)
		}
		n := rows.CommandTag().RowsAffected()
		total += n
		if n < PruneBatch {
			return total, nil
		}
		// As long again as the batch took, at most a second: the prune
		// takes half the server's time at most, and leaves the rest (its
		// disk's flushes above all) to the partitions' transactions.
		t := time.NewTimer(min(time.Since(start), time.Second))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return total, fmt.Errorf("keylanepg: prune: %w", ctx.Err())
		}
	}
}

// PruneBatch is how many outcomes one of Prune's transactions deletes.
const PruneBatch = 1000

// pruneSQL deletes up to $3 of namespace $1's outcomes recorded before
// $2, the oldest first, by the index on (namespace, at), in one
// transaction (a statement of its own).
const pruneSQL = `WITH d AS (SELECT job_id FROM keylane_outcomes WHERE namespace = $1 AND at < $2
	ORDER BY at LIMIT $3 FOR UPDATE SKIP LOCKED)
DELETE FROM keylane_outcomes o USING d WHERE o.namespace = $1 AND o.job_id = d.job_id`
