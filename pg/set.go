package keylanepg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
)

// SetHandler applies a transaction's jobs together, as sets: Read queues
// the statements that read what the jobs need (typically one SELECT … FOR
// UPDATE of every key's row), and the Write it returns, once they ran,
// folds the jobs over what they read in Go, in order, and queues the
// writes of all of them (typically one UPDATE … FROM unnest and one
// INSERT … SELECT FROM unnest), whatever their number. A PipelineHandler
// sends a statement or more per job, each parsed, planned and executed by
// the server; a SetHandler sends a few per transaction, and the server's
// work per job is its rows. shop.SellSet is the shop's sale that way.
//
// The fast path (see "Set handlers" in the package doc) sends Read's
// statements in its first round trip, behind BEGIN, the fence and the
// outcomes look-up, and Write's in its second, ahead of the outcomes'
// record and COMMIT: two round trips a transaction on a *pgxpool.Pool,
// three on another DB. Read is given the jobs of the transaction that
// run (not those of held keys), in order, with their Partition and Fence
// set; if one of them turns out recorded, its reads are rolled back with
// the rest and the careful path answers it from the record.
//
// Write's statements go in the message that commits: nothing they return
// can change a result, so they carry no pgx callback (a Write that
// queues one fails its jobs for good, ErrWriteCallback), and a write that
// matches no row still commits the job's result. Decide in Write from
// what Read locked; only a write the server refuses (an error) fails the
// job.
//
// An error of Read or of Write, a job's SetResult.Err, a failed statement,
// or an error or panic of a read's callback sends the transaction the
// careful way: rolled
// back, then applied one job at a time, each in its own savepoint (Read
// and Write called with that one job), so that a failing job fails alone
// — wrap its Err with keylane.Permanent to dead-letter it — and the rest
// commit. Read and Write may so run more than once for a job: they must
// not have side effects, and what their statements do must depend only
// on the jobs and the database's rows. What a Handler must not do
// (package doc) they must not do either.
type SetHandler interface {
	Read(jobs []keylane.Job, b *pgx.Batch) (Write, error)
}

// Write queues, on b, the writes of the jobs Read was given, once Read's
// statements ran (their callbacks were called), and returns each job's
// result, one SetResult per job in their order.
type Write func(b *pgx.Batch) ([]SetResult, error)

// SetResult is one job's result of a Write: Result, or Err when the job
// fails (the careful path then applies the transaction's jobs one at a
// time). A nil Result is an empty result.
type SetResult struct {
	Result []byte
	Err    error
}

// SetFunc adapts a function to SetHandler.
type SetFunc func(jobs []keylane.Job, b *pgx.Batch) (Write, error)

// Read calls f.
func (f SetFunc) Read(jobs []keylane.Job, b *pgx.Batch) (Write, error) { return f(jobs, b) }

// ApplySet is Apply for a SetHandler: the same transaction, the same
// outcomes, with the jobs' reads sent in one round trip and their writes
// in the next, with the record and COMMIT.
func ApplySet(ctx context.Context, db DB, g Group, h SetHandler, opts ...ApplyOpt) ([]Outcome, error) {
	return applySet(ctx, db, g, h, options(opts), make(map[string]bool))
}

func applySet(ctx context.Context, db DB, g Group, h SetHandler, cfg applyOpts, held map[string]bool) ([]Outcome, error) {
	return fastOrCareful(ctx, db, g, cfg, held, oneSet{h}, func() ([]Outcome, error) { return applySetFast(ctx, db, g, h, cfg, held) })
}

// oneSet runs a SetHandler's job as a Handler, a set of one: its reads in
// one batch, then its writes in another. The careful path of applySet,
// where every job has its savepoint.
type oneSet struct{ h SetHandler }

func (o oneSet) Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	jobs := []keylane.Job{job}
	var b pgx.Batch
	w, err := readSet(o.h, jobs, &b)
	if err != nil {
		return nil, err
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return nil, err
		}
	}
	var wb pgx.Batch
	rs, err := writeSet(w, jobs, &wb)
	if err != nil {
		return nil, err
	}
	if rs[0].Err != nil {
		return nil, rs[0].Err
	}
	if wb.Len() > 0 {
		if err := tx.SendBatch(ctx, &wb).Close(); err != nil {
			return nil, err
		}
	}
	return rs[0].Result, nil
}

// readSet calls h.Read, turning a panic into an error, refusing a
// statement that ends or reshapes the transaction and, for good, a nil
// Write.
func readSet(h SetHandler, jobs []keylane.Job, b *pgx.Batch) (w Write, err error) {
	n := b.Len()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylanepg: set handler's Read panicked on %d jobs from %s: %v", len(jobs), jobs[0].ID, r)
		}
		if err == nil && w == nil {
			err = keylane.Permanent(fmt.Errorf("keylanepg: set handler's Read returned no Write for %d jobs from %s", len(jobs), jobs[0].ID))
		}
	}()
	if w, err = h.Read(jobs, b); err != nil {
		return nil, err
	}
	if err := refuseSetTxControl(jobs, b, n); err != nil {
		return nil, err
	}
	guardCallbacks(b, n, jobs[0].ID)
	return w, nil
}

// writeSet calls w, turning a panic into an error, refusing a statement
// that ends or reshapes the transaction and, for good (no retry gives
// another answer), a result count that is not the jobs' and a statement
// with a callback (ErrWriteCallback).
func writeSet(w Write, jobs []keylane.Job, b *pgx.Batch) (rs []SetResult, err error) {
	n := b.Len()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylanepg: set handler's Write panicked on %d jobs from %s: %v", len(jobs), jobs[0].ID, r)
		}
	}()
	if rs, err = w(b); err != nil {
		return nil, err
	}
	if len(rs) != len(jobs) {
		return nil, keylane.Permanent(fmt.Errorf("keylanepg: set handler's Write returned %d results for %d jobs from %s", len(rs), len(jobs), jobs[0].ID))
	}
	for _, qq := range b.QueuedQueries[n:] {
		if qq.Fn != nil {
			return nil, keylane.Permanent(fmt.Errorf("%w: set handler's Write queued a statement with a callback (jobs from %s): its statements go with COMMIT, so nothing they return can change a result; read in Read", ErrWriteCallback, jobs[0].ID))
		}
	}
	return rs, refuseSetTxControl(jobs, b, n)
}

// ErrWriteCallback is in the error of a job whose set handler's Write
// queued a statement with a pgx callback (QueryRow, Query, Exec): Write's
// statements run in the message that commits, so a callback could only
// fail after the server committed, and the job would be answered as
// applied. Such a job fails for good.
var ErrWriteCallback = errors.New("keylanepg: a Write's statement has a callback")

// refuseSetTxControl is refuseTxControl for the statements queued on b
// from its n-th, for a set: a single job's refusal is that job's; a
// larger set's is the first job's (the careful path then finds the job).
func refuseSetTxControl(jobs []keylane.Job, b *pgx.Batch, n int) error {
	for _, qq := range b.QueuedQueries[n:] {
		if err := refuseTxControl(jobs[0].ID, qq.SQL); err != nil {
			return err
		}
	}
	return nil
}

// guardCallbacks makes a panic in the pgx callback of a statement queued
// on b from its n-th that statement's error, so that the batch's results
// are still read to the end (a panic out of BatchResults.Close leaves the
// connection mid-pipeline, in the transaction, holding the fence row).
func guardCallbacks(b *pgx.Batch, n int, jobID string) {
	for _, qq := range b.QueuedQueries[n:] {
		fn := qq.Fn
		if fn == nil {
			continue
		}
		qq.Fn = func(br pgx.BatchResults) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("keylanepg: a statement's callback panicked (job %s): %v", jobID, r)
				}
			}()
			return fn(br)
		}
	}
}

// flagFailures wraps the callbacks of the statements queued on b from its
// n-th so that a failed statement or callback sets *failed.
func flagFailures(b *pgx.Batch, n int, failed *bool) {
	for _, qq := range b.QueuedQueries[n:] {
		fn := qq.Fn
		qq.Fn = func(br pgx.BatchResults) error {
			var err error
			if fn != nil {
				err = fn(br)
			} else {
				_, err = br.Exec()
			}
			if err != nil {
				*failed = true
			}
			return err
		}
	}
}

// applySetFast is the fast path of applySet: as applyFast, with the set's
// reads in the first round trip and its writes in the second.
func applySetFast(ctx context.Context, db DB, g Group, h SetHandler, cfg applyOpts, held map[string]bool) ([]Outcome, error) {
	b, st, err := fastBatch(g, cfg)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return []Outcome{}, nil
	}
	var (
		jobs   = make([]keylane.Job, 0, len(g.Jobs))
		at     = make([]int, 0, len(g.Jobs)) // jobs[k] is g.Jobs[at[k]]
		w      Write
		failed bool // a read or write statement, or its callback, failed
	)
	for i, job := range g.Jobs {
		if held[job.Key] {
			continue
		}
		job.Partition, job.Fence = g.Partition, g.Fence
		jobs, at = append(jobs, job), append(at, i)
	}
	if len(jobs) > 0 {
		n := b.Len()
		if w, err = readSet(h, jobs, b); err != nil {
			return nil, errCareful
		}
		flagFailures(b, n, &failed)
	}
	tx, err := sendFast(ctx, db, b, st, g, &failed, "reads")
	if err != nil {
		return nil, err
	}
	defer rollback(ctx, tx.end)

	out := make([]Outcome, len(g.Jobs))
	for i, job := range g.Jobs {
		out[i] = Outcome{JobID: job.ID, Key: job.Key, Status: Held}
	}
	var (
		wb     pgx.Batch
		record []any // none when no job applied: COMMIT alone
	)
	if len(jobs) > 0 {
		rs, err := writeSet(w, jobs, &wb)
		if err != nil {
			return nil, errCareful
		}
		var (
			appIDs  = make([]string, len(jobs))
			appKeys = make([]string, len(jobs))
			appRes  = make([][]byte, len(jobs))
		)
		for k, r := range rs {
			if r.Err != nil {
				return nil, errCareful
			}
			res := r.Result
			if res == nil {
				res = []byte{}
			}
			job := jobs[k]
			out[at[k]] = Outcome{JobID: job.ID, Key: job.Key, Status: Applied, Result: res, Fence: g.Fence, At: st.started}
			appIDs[k], appKeys[k], appRes[k] = job.ID, job.Key, res
		}
		flagFailures(&wb, 0, &failed)
		record = []any{g.Namespace, int64(g.Fence), appIDs, appKeys, appRes}
	}
	if err := tx.recordAndCommit(ctx, &wb, record); err != nil {
		// A write that failed at the server left the transaction aborted
		// and nothing committed: the careful path finds the job. A cut
		// connection fails the writes' callbacks too, but may have
		// committed: that is the caller's to find out, as for any group.
		if (failed || notRun(err)) && ctx.Err() == nil && !errors.Is(err, errFateUnknown) {
			return nil, errCareful
		}
		return nil, err
	}
	return out, nil
}
