package keylanepg

import (
	"context"
	"errors"
	"github.com/jackc/pgx/v5/pgconn"
	"time"

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
	// Handler applies one job inside the group's transaction.
	Handler Handler
	// IdleTimeout, if set, is Apply's IdleTimeout: set it below the lease
	// TTL, so a paused owner's transaction does not hold its successor
	// for longer than that.
	IdleTimeout time.Duration
}

// ApplyGroup applies g through Apply and maps its outcomes.
func (a *Applier) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	if a.DB == nil || a.Handler == nil {
		return nil, errors.New("keylanepg: Applier needs a DB and a Handler")
	}
	var opts []ApplyOpt
	if a.IdleTimeout > 0 {
		opts = append(opts, IdleTimeout(a.IdleTimeout))
	}
	out, err := Apply(ctx, a.DB, Group{Namespace: g.Namespace, Partition: g.Partition, Fence: g.Fence, Jobs: g.Jobs}, a.Handler, opts...)
	if err != nil {
		if operatorsToFix(err) {
			// keylane's own statements refused for what they are: the
			// worker holds the jobs and says so at ERROR, never
			// dead-letters them for it (see "With a keylane worker").
			return nil, keylane.Permanent(err)
		}
		return nil, err
	}
	res := make([]keylane.JobOutcome, len(out))
	for i, o := range out {
		switch o.Status {
		case Applied, Recorded:
			res[i] = keylane.JobOutcome{Result: o.Result, Done: true}
		case Failed:
			res[i] = keylane.JobOutcome{Err: o.Err}
		}
	}
	return res, nil
}

var _ keylane.GroupApplier = (*Applier)(nil)

// operatorsToFix reports whether err, a whole group's failure, is a
// refusal that no retry cures until an operator acts: SQLSTATE class 42
// (an undefined table, a privilege revoked), 3F (a schema gone), 28 (the
// role may not log in) or 0A (a feature the server lacks). Connection
// failures, shutdowns, serialization failures and deadlocks are not.
func operatorsToFix(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	switch pe.Code[:2] {
	case "42", "3F", "28", "0A":
		return true
	}
	return false
}
