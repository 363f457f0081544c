package keylanepg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane"
)

// Handler applies one job inside the group's transaction, like keylane's
// Handler but with tx to write in. The result is recorded as the job's
// outcome in the same transaction; a redelivered job is answered from
// there and never handled again.
//
// A returned error rolls back this job's writes alone (its savepoint) and
// leaves the group's other jobs to commit; the job is not recorded. A plain
// error is retried: the key's later jobs in the group are held back, to
// keep the key's order. Wrap it with keylane.Permanent to dead-letter the
// job: the key's later jobs then run. A refusal that is an answer (sold
// out) is a result, not an error.
//
// Handle must not commit or roll back tx (the tx it gets refuses to), nor
// cause side effects outside it that must happen once: only what is
// written through tx is exactly once. See the package doc.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	return f(ctx, tx, job)
}

// JSONHandler makes a Handler of f, with request and response in JSON, as
// keylane.JSONHandler does. A payload that does not decode is a permanent
// error.
func JSONHandler[Req, Resp any](f func(ctx context.Context, tx pgx.Tx, job keylane.Job, req Req) (Resp, error)) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
		var req Req
		if err := json.Unmarshal(job.Payload, &req); err != nil {
			return nil, keylane.Permanent(fmt.Errorf("keylanepg: payload of job %s is not a %T: %w", job.ID, req, err))
		}
		resp, err := f(ctx, tx, job, req)
		if err != nil {
			return nil, err
		}
		rb, err := json.Marshal(resp)
		if err != nil {
			return nil, keylane.Permanent(fmt.Errorf("keylanepg: encode response of job %s: %w", job.ID, err))
		}
		return rb, nil
	})
}

// ErrTxOwned is the error of Commit and Rollback called by a Handler on
// the tx it was given: keylanepg owns the transaction.
var ErrTxOwned = errors.New("keylanepg: the group's transaction is keylanepg's to commit or roll back")

// jobTx is the tx a Handler gets: the group's transaction, minus Commit
// and Rollback (Begin, a savepoint nested in the job's own, stays open to
// it). Between two jobs the savepoint rolls on — release the previous
// job's, open this one's — and jobTx sends that roll in the same round trip
// as the job's first statement, so a job costs no round trip of its own.
type jobTx struct {
	pgx.Tx
	state rollState
	jobID string
	// rollErr is why the roll failed (rollFailed).
	rollErr error
}

// rollState tells where a job's savepoint stands.
type rollState int

const (
	// rollPending: the previous job's writes sit in the open savepoint and
	// this job has sent no statement yet, so has written nothing.
	rollPending rollState = iota
	// rollDone: this job runs in its own savepoint.
	rollDone
	// rollFailed: the roll was sent and failed; which savepoint is open is
	// unknown, so no single job can be rolled back: the group fails.
	rollFailed
)

func (t *jobTx) Commit(context.Context) error   { return ErrTxOwned }
func (t *jobTx) Rollback(context.Context) error { return ErrTxOwned }

// rides tells whether a statement can carry the roll in its batch: it has
// arguments (without them pgx may send several statements in one string,
// which a batch cannot) and no option of a call first (a query mode,
// result formats): a batch would take an option for an argument.
func rides(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// flush sends the pending roll on its own, before a call that cannot carry
// it.
func (t *jobTx) flush(ctx context.Context) error {
	if t.state != rollPending {
		return nil
	}
	if _, err := t.Tx.Exec(ctx, nextJobSQL); err != nil {
		t.state, t.rollErr = rollFailed, err
		return fmt.Errorf("keylanepg: savepoint: %w", err)
	}
	t.state = rollDone
	return nil
}

// roll sends the pending roll and the statement in one batch, and returns
// the batch with the statement's result next.
func (t *jobTx) roll(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	var b pgx.Batch
	b.Queue(releaseSQL)
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, &b)
	for range 2 {
		if _, err := br.Exec(); err != nil {
			t.state, t.rollErr = rollFailed, err
			br.Close()
			return nil, fmt.Errorf("keylanepg: savepoint: %w", err)
		}
	}
	t.state = rollDone
	return br, nil
}

func (t *jobTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := refuseTxControl(t.jobID, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.state != rollPending || !rides(args) {
		if err := t.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return t.Tx.Exec(ctx, sql, args...)
	}
	br, err := t.roll(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *jobTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := refuseTxControl(t.jobID, sql); err != nil {
		return nil, err
	}
	if t.state != rollPending || !rides(args) {
		if err := t.flush(ctx); err != nil {
			return nil, err
		}
		return t.Tx.Query(ctx, sql, args...)
	}
	br, err := t.roll(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (t *jobTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return &batchRow{rows}
}

func (t *jobTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, qq := range b.QueuedQueries {
		if err := refuseTxControl(t.jobID, qq.SQL); err != nil {
			return errBatch{err}
		}
	}
	if err := t.flush(ctx); err != nil {
		return errBatch{err}
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *jobTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *jobTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *jobTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// LargeObjects and Conn give ways around jobTx: the roll goes first.
func (t *jobTx) LargeObjects() pgx.LargeObjects {
	_ = t.flush(context.Background())
	return t.Tx.LargeObjects()
}

func (t *jobTx) Conn() *pgx.Conn {
	_ = t.flush(context.Background())
	return t.Tx.Conn()
}

// batchRows are a statement's rows read from the batch that carried the
// roll; the batch closes with them (pgx closes rows at their end itself, so
// Next does too).
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is QueryRow's row over batchRows, as pgx's own: the first row
// or ErrNoRows, and the rows closed.
type batchRow struct{ rows pgx.Rows }

func (r *batchRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
