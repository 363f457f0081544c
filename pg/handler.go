package keylanepg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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

// ownedTx is the tx a Handler gets: the group's transaction, minus Commit
// and Rollback. Begin (a savepoint nested in the job's own) stays open to it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
