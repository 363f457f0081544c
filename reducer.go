package keylane

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

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

// writeUncertain reports whether a failed state write may have landed:
// the write was sent (a *stateError, not the check before it) and was
// cancelled or timed out; a conflict or a refusal is a sure no.
func writeUncertain(err error) bool {
	var se *stateError
	return errors.As(err, &se) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// reduce runs the reducer for one job, turning a panic into an error.
func (o *owner) reduce(job Job, cur []byte) (next, res []byte, err error) {
	ctx, span := traceOf(job).run(o.ctx, job)
	defer span.end(&err) // after the recover below has set err
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylane: reducer panicked: %v", r)
		}
	}()
	return o.cfg.Reducer.Reduce(ctx, job, cur)
}

// applyGroup group-commits jobs (one key, stream order) and tells the
// reducer's CommitObserver, if any, the fate of every run. See State.group.
func (o *owner) applyGroup(jobs []Job, out [][]byte) (n int, rerr, werr error) {
	defer o.observeGroup(o.now(), &n, &werr)
	var ran []int
	failed := -1 // the run whose reduce failed: never in the write
	n, rerr, werr = o.state.Group(o.ctx, jobs, out, func(i int, cur []byte) ([]byte, []byte, error) {
		ran = append(ran, i)
		o.stats.Runs.Add(1)
		start := o.jobClock()
		state, res, err := o.reduce(jobs[i], cur)
		o.logRan(&jobs[i], start, err)
		if err != nil {
			failed = i
		}
		return state, res, err
	})
	traceGroup(jobs, n, werr)
	if werr == nil {
		o.logCommitted(jobs[:n])
	}
	if obs, ok := o.cfg.Reducer.(CommitObserver); ok {
		unsure, _ := o.cfg.Reducer.(UncertainCommitObserver)
		for _, i := range ran {
			if unsure != nil && werr != nil && i != failed && writeUncertain(werr) {
				unsure.CommitUncertain(jobs[i])
				continue
			}
			obs.Committed(jobs[i], werr == nil && i < n)
		}
	}
	return n, rerr, werr
}

// reduceOne applies one job through the reducer, for the single-job path
// (retries, redelivered jobs).
func (o *owner) reduceOne(job Job) ([]byte, error) {
	var out [1][]byte
	n, rerr, werr := o.applyGroup([]Job{job}, out[:])
	if werr != nil {
		return nil, werr
	}
	if n == 0 {
		return nil, rerr
	}
	return out[0], nil
}
