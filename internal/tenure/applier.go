package tenure

import (
	"errors"
	"fmt"
	"sync"

	"github.com/keylane/keylane/internal/core"
)

// errApplyUnknown marks a GroupApplier's error of a whole call: the
// group's fate is unknown, so the job is tried again without counting an
// attempt (the database's record settles what committed).
var errApplyUnknown = errors.New("keylane: the group's transaction failed or its commit's fate is unknown")

// applyGroupDB applies jobs (one key, stream order) through the Applier,
// in one transaction with the groups of other keys ready meanwhile
// (applyBatcher). A stale fence comes back errors.Is ErrStaleFence; any other error of the
// whole call errors.Is errApplyUnknown.
//
// alone applies them in a transaction of their own, joined with no other
// key's group: a retry after a whole call failed, so that a failure counts
// against the job whose transaction it is.
func (o *Owner) applyGroupDB(jobs []core.Job, alone bool) (out []core.JobOutcome, err error) {
	var n int
	defer o.observeGroup(o.now(), &n, &err)
	o.stats.Runs.Add(int64(len(jobs)))
	start := o.jobClock()
	spans := make([]runSpan, len(jobs))
	for i := range jobs {
		jobs[i].Partition, jobs[i].Fence = o.p, o.l.Fence()
		_, spans[i] = traceOf(jobs[i]).run(o.ctx, jobs[i])
	}
	r := &applyReq{jobs: jobs, wake: make(chan struct{})}
	if alone {
		o.applyBatch([]*applyReq{r})
	} else {
		o.applies.do(r, o.applyBatch)
	}
	out, err = r.out, r.err
	for i := range jobs {
		var jerr error
		if err != nil {
			jerr = err
		} else {
			jerr = out[i].Err
		}
		spans[i].end(&jerr)
		o.logRan(&jobs[i], start, jerr)
	}
	if err == nil {
		for n < len(out) && out[n].Done {
			n++
		}
		o.logCommitted(jobs[:n])
	}
	traceGroup(jobs, n, err)
	return out, err
}

// applyBatcher joins the groups that a partition's lane runners (one key
// each) bring while a transaction is in flight into the next one: one
// ApplyGroup, one commit, for the ready groups of several keys. The first
// caller leads: it runs its own group at once; whoever comes meanwhile
// queues, and when the transaction ends the whole queue goes as one, led
// by its first caller. One partition's transactions would serialize on
// its fence in the database anyway; joined, they share a commit.
type applyBatcher struct {
	mu    sync.Mutex
	busy  bool
	queue []*applyReq
}

// applyReq is one key's group, and what became of it.
type applyReq struct {
	jobs []core.Job
	out  []core.JobOutcome
	err  error
	// wake is closed when the request is settled (finished) or leads the
	// next batch (batch set).
	wake     chan struct{}
	finished bool
	batch    []*applyReq
}

// do settles r, in a batch that run applies, and returns when r's outcome
// is set.
func (b *applyBatcher) do(r *applyReq, run func([]*applyReq)) {
	b.mu.Lock()
	if b.busy {
		b.queue = append(b.queue, r)
		b.mu.Unlock()
		<-r.wake
		if r.finished {
			return
		}
	} else {
		b.busy = true
		r.batch = []*applyReq{r}
		b.mu.Unlock()
	}
	run(r.batch)
	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue
		b.queue = nil
		next[0].batch = next
		close(next[0].wake) // it leads the next batch
	} else {
		b.busy = false
	}
	b.mu.Unlock()
	for _, x := range r.batch {
		if x != r {
			x.finished = true
			close(x.wake)
		}
	}
}

// applyBatch applies the groups of reqs (each of its own key) in one
// ApplyGroup and hands each its outcomes. A stale fence comes back
// errors.Is ErrStaleFence; any other error of the whole call errors.Is
// errApplyUnknown, for every group of the batch.
func (o *Owner) applyBatch(reqs []*applyReq) {
	jobs := reqs[0].jobs
	if len(reqs) > 1 {
		jobs = nil
		for _, r := range reqs {
			jobs = append(jobs, r.jobs...)
		}
	}
	out, err := o.applyCall(core.JobGroup{Namespace: o.topo.Names.Namespace, Partition: o.p, Fence: o.l.Fence(), Jobs: jobs})
	if err == nil && len(out) != len(jobs) {
		// The applier broke its contract: no retry cures that, so it is
		// said at ERROR and counted like a refusal for good (the jobs
		// are held: the transaction may have committed).
		err = core.Permanent(fmt.Errorf("keylane: the applier returned %d outcomes for %d jobs", len(out), len(jobs)))
	}
	if err != nil && !errors.Is(err, core.ErrStaleFence) {
		err = fmt.Errorf("%w: %w", errApplyUnknown, err)
	}
	for _, r := range reqs {
		if err != nil {
			r.err = err
			continue
		}
		r.out, out = out[:len(r.jobs):len(r.jobs)], out[len(r.jobs):]
	}
}

// applyCall calls the Applier, turning a panic into an error of the whole
// call (its transaction's fate is then unknown).
func (o *Owner) applyCall(g core.JobGroup) (out []core.JobOutcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylane: applier panicked: %v", r)
		}
	}()
	return o.cfg.Applier.ApplyGroup(o.ctx, g)
}

// applyOne applies one job through the Applier, for the one-job path
// (retries, redelivered jobs); alone as for applyGroupDB.
func (o *Owner) applyOne(job core.Job, alone bool) ([]byte, error) {
	out, err := o.applyGroupDB([]core.Job{job}, alone)
	if err != nil {
		return nil, err
	}
	switch {
	case out[0].Done:
		return out[0].Result, nil
	case out[0].Err != nil:
		return nil, out[0].Err
	}
	// Held with no earlier job to blame: the applier broke its contract.
	return nil, core.Permanent(fmt.Errorf("%w: the applier held a group's only job", errApplyUnknown))
}

// runApplied runs queued jobs of one key, in order, through the Applier,
// applying them in groups in one transaction each, then replies to and
// acks each that is done. Jobs that may have run before under an earlier
// owner, a failed job and groups whose call failed go through process, one
// at a time, with its retries, backoff and dead-lettering; the database's
// record answers those that committed.
func (o *Owner) runApplied(ts []*task) {
	jobs := make([]core.Job, len(ts))
	res := make([][]byte, len(ts))
	for len(ts) > 0 {
		// A redelivered head goes through process, which counts its
		// starts (a job that crashes every worker is dead-lettered);
		// ApplyGroup answers it from the record if it committed. A
		// caller's ID may name a job dead-lettered long ago, whose outcome
		// only the results bucket keeps: takeGroup answers it from there.
		var k int
		var ok bool
		if ts, k, ok = o.takeGroup(ts); !ok {
			return
		}
		g := ts[:k]
		for i, t := range g {
			jobs[i] = t.job
		}
		out, err := o.applyGroupDB(jobs[:k], false)
		if errors.Is(err, core.ErrStaleFence) {
			o.stats.Stale.Add(1)
			o.log.Warn("stale fence: a newer owner committed to the database; stepping down", "key", g[0].job.Key, "err", err)
			o.abort()
			return
		}
		if err != nil {
			// Nothing replied or acked: the head goes through the one-job
			// path (retries with backoff), the rest back to the lane; the
			// record answers what did commit.
			o.log.Warn("group transaction failed; settling the head alone", "key", g[0].job.Key, "jobs", k, "err", err)
			o.ln.requeue(ts[0].job.Key, ts[1:])
			o.process(ts[0])
			return
		}
		n := 0
		for n < k && out[n].Done {
			res[n] = out[n].Result
			n++
		}
		// Committed in the database: the results bucket keeps only what a
		// Call or a caller's ID needs to recover a lost reply.
		if !o.keepOutcomes(g[:n], res[:n]) {
			o.stats.Unacked.Add(int64(len(ts)))
			return
		}
		o.replyGrouped(g[:n], res[:n])
		for i := range n {
			if o.finish(g[i], res[i], nil, false) {
				o.stats.Succeeded.Add(1)
			}
			res[i] = nil
		}
		ts = ts[n:]
		if n < k {
			// A failed (or held) job: it retries or is dead-lettered
			// alone; the jobs after it go back to the lane, and those
			// the transaction applied are answered from the record.
			ts[0].firstErr = out[n].Err
			if ts[0].firstErr == nil {
				ts[0].firstErr = core.Permanent(fmt.Errorf("%w: the applier held a job no earlier job of its key failed before", errApplyUnknown))
			}
			o.ln.requeue(ts[0].job.Key, ts[1:])
			o.process(ts[0])
			return
		}
	}
}
