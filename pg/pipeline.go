package keylanepg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
)

// PipelineHandler is a Handler that queues a job's statements instead of
// running them: Apply sends the statements of every job of a group in one
// round trip, behind the fence and the outcomes look-up, so a transaction
// costs two round trips (that one; the outcomes' record with COMMIT) on a
// *pgxpool.Pool, three on another DB (the record, then COMMIT), whatever
// its number of jobs, where a Handler's costs one per statement.
// Use it when a job's statements do not depend on one another's results
// in Go (one statement with data-modifying CTEs can do what several would:
// see shop.SellPipeline).
//
// Queue queues job's statements on b (b.Queue, with the pgx callbacks
// QueryRow, Query or Exec to read their results) and returns the Result
// that makes the job's result once they ran. An error of Queue fails the
// job before anything is sent (the statements it queued are dropped), as a
// Handler's error does: wrap it with keylane.Permanent to dead-letter the
// job. A failed statement, a callback's error or an error of the Result
// fail the job too, and are handled as in "Failures" of the package doc.
//
// Queue may be called more than once for a job (see there): it must not
// have side effects, and its statements' effects must depend only on the
// job and the database's rows. What a Handler must not do (package doc),
// a PipelineHandler must not do either.
type PipelineHandler interface {
	Queue(job keylane.Job, b *pgx.Batch) (Result, error)
}

// Result makes a queued job's result once its statements ran (their
// callbacks were called). A nil Result is an empty result.
type Result func() ([]byte, error)

// PipelineFunc adapts a function to PipelineHandler.
type PipelineFunc func(job keylane.Job, b *pgx.Batch) (Result, error)

// Queue calls f.
func (f PipelineFunc) Queue(job keylane.Job, b *pgx.Batch) (Result, error) { return f(job, b) }

// JSONPipeline makes a PipelineHandler of f, with request and response in
// JSON, as JSONHandler does for a Handler. A payload that does not decode
// is a permanent error.
func JSONPipeline[Req, Resp any](f func(job keylane.Job, req Req, b *pgx.Batch) (func() (Resp, error), error)) PipelineHandler {
	return PipelineFunc(func(job keylane.Job, b *pgx.Batch) (Result, error) {
		var req Req
		if err := json.Unmarshal(job.Payload, &req); err != nil {
			return nil, keylane.Permanent(fmt.Errorf("keylanepg: payload of job %s is not a %T: %w", job.ID, req, err))
		}
		resp, err := f(job, req, b)
		if err != nil {
			return nil, err
		}
		return func() ([]byte, error) {
			var r Resp
			if resp != nil {
				if r, err = resp(); err != nil {
					return nil, err
				}
			}
			rb, err := json.Marshal(r)
			if err != nil {
				return nil, keylane.Permanent(fmt.Errorf("keylanepg: encode response of job %s: %w", job.ID, err))
			}
			return rb, nil
		}, nil
	})
}

// ApplyPipeline is Apply for a PipelineHandler: the same transaction, the
// same outcomes, with the jobs' statements sent in one round trip.
func ApplyPipeline(ctx context.Context, db DB, g Group, p PipelineHandler, opts ...ApplyOpt) ([]Outcome, error) {
	return applyPipeline(ctx, db, g, p, options(opts), make(map[string]bool))
}

// one runs a PipelineHandler's job as a Handler: its statements in one
// batch, then its Result. The careful path of applyPipeline, where every
// job has its savepoint.
type one struct{ p PipelineHandler }

func (o one) Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	var b pgx.Batch
	res, err := queue(o.p, job, &b)
	if err != nil {
		return nil, err
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return nil, err
		}
	}
	return res()
}

// queue calls p.Queue for job, turning a panic into an error, dropping
// what it queued when it fails, and a nil Result into an empty one.
func queue(p PipelineHandler, job keylane.Job, b *pgx.Batch) (res Result, err error) {
	n := b.Len()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylanepg: handler panicked on job %s: %v", job.ID, r)
		}
		if err != nil {
			clear(b.QueuedQueries[n:])
			b.QueuedQueries = b.QueuedQueries[:n]
			return
		}
		if res == nil {
			res = func() ([]byte, error) { return nil, nil }
		}
		res = safeResult(job, res)
	}()
	if res, err = p.Queue(job, b); err != nil {
		return nil, err
	}
	for _, qq := range b.QueuedQueries[n:] {
		if err := refuseTxControl(job.ID, qq.SQL); err != nil {
			return nil, err
		}
	}
	guardCallbacks(b, n, job.ID)
	return res, nil
}

// safeResult turns a Result's panic into the job's error.
func safeResult(job keylane.Job, res Result) Result {
	return func() (out []byte, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("keylanepg: handler's result panicked on job %s: %v", job.ID, r)
			}
		}()
		return res()
	}
}

// notRun reports whether err says that pgx ran none of a batch's
// statements: it could not encode a statement's arguments ("build") or
// prepare one ("prepare") before sending the batch, so nothing of it, and
// no COMMIT in it, reached the server's executor.
func notRun(err error) bool {
	var pe pgx.ErrPreprocessingBatch
	return errors.As(err, &pe)
}

// errFateUnknown is in recordAndCommit's error when its COMMIT went out
// and no answer came back: the transaction may have committed, so only a
// new transaction behind the fence's lock (the worker's next try, or
// Lookup) can tell, never an assumption either way.
var errFateUnknown = errors.New("its fate is unknown: apply again or Lookup")

// errCareful is why applyPipeline rolled its transaction back and applied
// the group the careful way: a job of the group failed, or was recorded.
var errCareful = errors.New("keylanepg: the group takes the careful path")

// applyPipeline applies g the fast way, and, when that cannot be, the
// careful way (apply, each job in its own savepoint):
//
//  1. One round trip: BEGIN, the fence, the outcomes look-up, then every
//     job's statements (but those of held keys), with no savepoint.
//  2. If the fence was refused: roll back, *StaleFenceError. If a job of
//     the group is recorded (a redelivery), or a job failed (Queue, a
//     statement, a callback, its Result): roll back — nothing of the
//     group is written — and apply the group the careful way, which
//     answers recorded jobs from the record and fails a failing job
//     alone.
//  3. Otherwise: record every job's outcome, and COMMIT: in one round
//     trip on a connection the DB lends (a *pgxpool.Pool: lender), in two
//     through a pgx.Tx (whose Commit is a round trip of its own).
func applyPipeline(ctx context.Context, db DB, g Group, p PipelineHandler, cfg applyOpts, held map[string]bool) ([]Outcome, error) {
	return fastOrCareful(ctx, db, g, cfg, held, one{p}, func() ([]Outcome, error) { return applyFast(ctx, db, g, p, cfg, held) })
}

// fastOrCareful runs a fast path and, when it gave way (errCareful) while
// ctx lives, applies g the careful way with careful, each job in its own
// savepoint: the one driver of the pipeline's and the set's two paths.
func fastOrCareful(ctx context.Context, db DB, g Group, cfg applyOpts, held map[string]bool, careful Handler, fast func() ([]Outcome, error)) ([]Outcome, error) {
	out, err := fast()
	if errors.Is(err, errCommitRefused) && ctx.Err() == nil {
		// The server refused the COMMIT (a deferred constraint broken)
		// and rolled back: the careful path checks each job's at its end.
		cfg.checkDeferred = true
		return apply(ctx, db, g, careful, cfg, held)
	}
	if errors.Is(err, errCareful) && ctx.Err() == nil {
		return apply(ctx, db, g, careful, cfg, held)
	}
	return out, err
}

func applyFast(ctx context.Context, db DB, g Group, p PipelineHandler, cfg applyOpts, held map[string]bool) ([]Outcome, error) {
	b, st, err := fastBatch(g, cfg)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return []Outcome{}, nil
	}
	var (
		results = make([]Result, len(g.Jobs))
		refused map[int]error   // jobs whose Queue failed: nothing sent
		holding map[string]bool // keys newly held by a retriable refusal
		failed  bool            // a job's statement or callback failed
	)
	for i, job := range g.Jobs {
		if held[job.Key] || holding[job.Key] {
			continue
		}
		job.Partition, job.Fence = g.Partition, g.Fence
		from := b.Len()
		res, err := queue(p, job, b)
		if err != nil {
			// Nothing of the job is sent: it fails alone, as in its
			// savepoint, and a retriable failure holds its key's later
			// jobs.
			if refused == nil {
				refused = make(map[int]error)
			}
			refused[i] = err
			if !errors.Is(err, keylane.ErrPermanent) {
				if holding == nil {
					holding = make(map[string]bool)
				}
				holding[job.Key] = true
			}
			continue
		}
		results[i] = res
		flagFailures(b, from, &failed)
	}
	tx, err := sendFast(ctx, db, b, st, g, &failed, "jobs")
	if err != nil {
		return nil, err
	}
	defer rollback(ctx, tx.end)

	out := make([]Outcome, len(g.Jobs))
	var (
		appIDs  = make([]string, 0, len(g.Jobs))
		appKeys = make([]string, 0, len(g.Jobs))
		appRes  = make([][]byte, 0, len(g.Jobs))
	)
	for i, job := range g.Jobs {
		if err, ok := refused[i]; ok {
			out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Failed, Err: err}
			continue
		}
		if results[i] == nil {
			out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Held}
			continue
		}
		res, err := results[i]()
		if err != nil {
			return nil, errCareful
		}
		if res == nil {
			res = []byte{}
		}
		out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Applied, Result: res, Fence: g.Fence, At: st.started}
		appIDs, appKeys, appRes = append(appIDs, job.ID), append(appKeys, job.Key), append(appRes, res)
	}
	var record []any // none when no job applied: COMMIT alone
	if len(appIDs) > 0 {
		record = []any{g.Namespace, int64(g.Fence), appIDs, appKeys, appRes}
	}
	if err := tx.recordAndCommit(ctx, nil, record); err != nil {
		return nil, err
	}
	for k := range holding {
		held[k] = true
	}
	return out, nil
}

// fastState is what the fast path's first round trip tells besides the
// jobs' results.
type fastState struct {
	started  time.Time // the transaction's timestamp
	fenced   bool      // the fence was taken
	recorded bool      // a job of the group has an outcome already
}

// fastBatch checks g for the fast path and returns its first batch up to
// the jobs' statements: BEGIN, the idle timeout, the fence and the
// outcomes look-up, whose results fill the fastState once the batch ran.
// No batch for a group without jobs, or with an error: errCareful when an
// ID is in the group twice (the careful path applies the first and
// answers the second from it).
func fastBatch(g Group, cfg applyOpts) (*pgx.Batch, *fastState, error) {
	ids, err := checkGroup(g)
	if err != nil || len(g.Jobs) == 0 {
		return nil, nil, err
	}
	if hasDuplicate(ids) {
		return nil, nil, errCareful
	}
	b := &pgx.Batch{}
	st := &fastState{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if cfg.idle > 0 {
		queueIdle(b, cfg.idle)
	}
	b.Queue(fenceSQL, g.Namespace, g.Partition, int64(g.Fence)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&st.started)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		st.fenced = err == nil
		return err
	})
	b.Queue(outcomesSQL, g.Namespace, ids).Query(func(rows pgx.Rows) error {
		st.recorded = rows.Next()
		rows.Close()
		return rows.Err()
	})
	return b, st, nil
}

// hasDuplicate reports whether an ID is in ids twice.
func hasDuplicate(ids []string) bool {
	if len(ids) < 2 {
		return false
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			return true
		}
		seen[id] = true
	}
	return false
}

// sendFast sends the fast path's first batch, b, and reads what it told:
// the transaction, for the caller to end (rollback(ctx, tx.end)), or an
// error, the transaction ended: errCareful when a job's statement or
// callback failed (*failed) or a job of g is recorded, a
// *StaleFenceError when the fence was refused.
func sendFast(ctx context.Context, db DB, b *pgx.Batch, st *fastState, g Group, failed *bool, what string) (fastTx, error) {
	tx, br, err := beginFast(ctx, db, b)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok { // an error below, or a panic: the transaction ends here
			rollback(ctx, tx.end)
		}
	}()
	err = br.Close()
	switch {
	case err != nil && (*failed || notRun(err)) && ctx.Err() == nil:
		err = errCareful
	case err != nil:
		err = fmt.Errorf("keylanepg: begin, fence, outcomes and %s: %w", what, err)
	case !st.fenced:
		err = staleFence(ctx, tx, g)
	case st.recorded:
		err = errCareful
	default:
		ok = true
		return tx, nil
	}
	return nil, err
}

// lender is a DB that lends a connection of its own: a *pgxpool.Pool. On
// one, the fast path runs its transaction on the lent connection and sends
// the outcomes' record and COMMIT in one round trip (a pgx.Tx's Commit is
// a round trip of its own).
type lender interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// fastTx is the fast path's transaction, begun by its first batch: a
// pgx.Tx's, or one run by hand on a lent connection.
type fastTx interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	// recordAndCommit runs the statements queued on writes (a set's; nil
	// or empty: none), recordSQL with record (unless nil) and commits.
	recordAndCommit(ctx context.Context, writes *pgx.Batch, record []any) error
	// end rolls back what did not commit and gives back what was lent.
	end(ctx context.Context) error
}

// beginFast sends b, which begins the transaction (b.BeginTx), on a
// connection db lends if it is a lender, else through db.SendBatch.
func beginFast(ctx context.Context, db DB, b *pgx.Batch) (fastTx, pgx.BatchResults, error) {
	l, ok := db.(lender)
	if !ok {
		br := db.SendBatch(ctx, b)
		return pgxFastTx{br.Tx()}, br, nil
	}
	c, err := l.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("keylanepg: acquire a connection: %w", err)
	}
	// (The pgx.Tx its BatchResults carry is left unused: lentTx commits
	// and rolls back itself.)
	return &lentTx{c: c}, c.SendBatch(ctx, b), nil
}

// pgxFastTx is the fast path's transaction through a pgx.Tx.
type pgxFastTx struct{ tx pgx.Tx }

func (t pgxFastTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.tx.QueryRow(ctx, sql, args...)
}

func (t pgxFastTx) recordAndCommit(ctx context.Context, writes *pgx.Batch, record []any) error {
	if writes != nil && writes.Len() > 0 {
		// The writes and the record in one round trip, COMMIT in its own.
		if record != nil {
			writes.Queue(recordSQL, record...)
		}
		if err := t.tx.SendBatch(ctx, writes).Close(); err != nil {
			return fmt.Errorf("keylanepg: writes and record outcomes: %w", err)
		}
		record = nil
	}
	if record != nil {
		if _, err := t.tx.Exec(ctx, recordSQL, record...); err != nil {
			return fmt.Errorf("keylanepg: record outcomes: %w", err)
		}
	}
	if err := t.tx.Commit(ctx); err != nil {
		return commitError(err)
	}
	return nil
}

func (t pgxFastTx) end(ctx context.Context) error {
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// lentTx is the fast path's transaction on a lent connection, begun by the
// batch's BEGIN and ended by hand.
type lentTx struct {
	c *pgxpool.Conn
}

func (t *lentTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.c.QueryRow(ctx, sql, args...)
}

// recordAndCommit sends the writes, the record and COMMIT in one batch:
// a failed write or record skips the COMMIT (the server skips the rest of
// a pipeline after an error) and leaves the transaction for end to roll
// back.
func (t *lentTx) recordAndCommit(ctx context.Context, writes *pgx.Batch, record []any) error {
	b := writes
	if b == nil {
		b = &pgx.Batch{}
	}
	wrote := b.Len() > 0
	if record != nil {
		b.Queue(recordSQL, record...)
	}
	commit := b.Queue("commit")
	var tag pgconn.CommandTag
	commit.Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	if err := t.c.SendBatch(ctx, b).Close(); err != nil {
		if notRun(err) {
			return fmt.Errorf("keylanepg: writes and record outcomes not run, nothing committed: %w", err)
		}
		if (wrote || record != nil) && t.c.Conn().PgConn().TxStatus() == 'E' {
			// A write or the record failed: nothing committed.
			if wrote {
				return fmt.Errorf("keylanepg: writes and record outcomes: %w", err)
			}
			return fmt.Errorf("keylanepg: record outcomes: %w", err)
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && !t.c.Conn().PgConn().IsClosed() && t.c.Conn().PgConn().TxStatus() == 'I' {
			// The writes and the record ran; the server answered COMMIT
			// with an error (a deferred constraint) and rolled back.
			return commitError(err)
		}
		return fmt.Errorf("keylanepg: record outcomes and commit (%w): %w", errFateUnknown, err)
	}
	if tag.String() == "ROLLBACK" {
		return commitError(pgx.ErrTxCommitRollback)
	}
	return nil
}

// end rolls back a transaction still open (a refused fence, the careful
// path, a failed record) and gives the connection back; the pool closes
// one whose state is unknown.
func (t *lentTx) end(ctx context.Context) (err error) {
	defer t.c.Release()
	if pc := t.c.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		if _, err = t.c.Exec(ctx, "rollback"); err != nil {
			_ = t.c.Conn().Close(ctx)
		}
	}
	return err
}
