package tenure

import (
	"context"
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go"
)

// writeUncertain reports whether a failed state write may have landed:
// the write was sent (a *core.StateError, not the check before it) and was
// cancelled or timed out; a conflict or a refusal is a sure no.
func writeUncertain(err error) bool {
	var se *core.StateError
	return errors.As(err, &se) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// reduce runs the reducer for one job, turning a panic into an error.
func (o *Owner) reduce(job core.Job, cur []byte) (next, res []byte, err error) {
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
func (o *Owner) applyGroup(jobs []core.Job, out [][]byte) (n int, rerr, werr error) {
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
	if obs, ok := o.cfg.Reducer.(core.CommitObserver); ok {
		unsure, _ := o.cfg.Reducer.(core.UncertainCommitObserver)
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
func (o *Owner) reduceOne(job core.Job) ([]byte, error) {
	var out [1][]byte
	n, rerr, werr := o.applyGroup([]core.Job{job}, out[:])
	if werr != nil {
		return nil, werr
	}
	if n == 0 {
		return nil, rerr
	}
	return out[0], nil
}
