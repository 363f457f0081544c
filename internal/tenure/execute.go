package tenure

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/statestore"
)

// maxGroup bounds how many queued jobs of one key a runner takes at once
// to group-commit.
const maxGroup = 256

// runGroup runs queued jobs of one key, in order, through the reducer,
// committing them in groups (see State.group), then replies to and acks
// each. Jobs that may have run before under an earlier owner, jobs whose
// reduce failed and groups whose write failed go through process, one at
// a time, with its retries, backoff and dead-lettering.
func (o *Owner) runGroup(ts []*task) {
	jobs := make([]core.Job, len(ts))
	out := make([][]byte, len(ts))
	for len(ts) > 0 {
		var k int
		var ok bool
		if ts, k, ok = o.takeGroup(ts); !ok {
			return
		}
		g := ts[:k]
		for i, t := range g {
			jobs[i] = t.job
		}
		n, rerr, werr := o.applyGroup(jobs[:k], out[:k])
		if errors.Is(werr, core.ErrStaleFence) {
			o.stats.Stale.Add(1)
			o.log.Warn("stale fence: a newer owner wrote this key; stepping down", "key", g[0].job.Key, "err", werr)
			o.abort()
			return
		}
		if werr != nil {
			// Unknown outcome, or another writer: settle each job alone;
			// a re-read tells which ones the write covered.
			// The head goes through the one-job path (re-read, retries with
			// backoff); the rest go back to the lane and are grouped again
			// after a re-read, which settles those the write covered.
			o.log.Warn("group commit failed; settling the head alone", "key", g[0].job.Key, "jobs", k, "err", werr)
			o.ln.requeue(ts[0].job.Key, ts[1:])
			o.process(ts[0])
			return
		}
		if !o.keepOutcomes(g[:n], out[:n]) {
			// The tenure ended: nothing more is applied or acked here.
			o.stats.Unacked.Add(int64(len(ts)))
			return
		}
		o.replyGrouped(g[:n], out[:n]) // after the outcomes are kept, before any ack
		for i := range n {
			if o.finish(g[i], out[i], nil, false) {
				o.stats.Succeeded.Add(1)
			}
			out[i] = nil
		}
		ts = ts[n:]
		if n < k && (rerr != nil || n == 0) {
			ts[0].firstErr = rerr
			o.ln.requeue(ts[0].job.Key, ts[1:]) // process retries: let a stall see the rest
			o.process(ts[0])
			return
		}
	}
}

// takeGroup readies the next group of a group runner's queued jobs ts
// (one key, stream order): it answers from their kept outcomes the head
// jobs that have one (a caller's ID may name a job that finished long
// ago: one concurrent look-up), and returns the rest of ts, whose first k
// jobs (none that may have run before) form the group, their Attempt set
// to 1. It returns false when the runner must stop: the tenure ended, or
// the head may have run before under an earlier owner and went through
// process (which counts its starts and retries), the rest back to its
// lane.
func (o *Owner) takeGroup(ts []*task) ([]*task, int, bool) {
	for len(ts) > 0 {
		if o.ctx.Err() != nil {
			o.stats.Unacked.Add(int64(len(ts)))
			return nil, 0, false
		}
		if ts[0].maybeDup {
			o.ln.requeue(ts[0].job.Key, ts[1:]) // process may retry: let a stall see the rest
			o.process(ts[0])
			return nil, 0, false
		}
		k := groupEnd(ts)
		i := o.firstKept(ts[:k])
		if o.ctx.Err() != nil {
			o.stats.Unacked.Add(int64(len(ts)))
			return nil, 0, false
		}
		if i == 0 {
			o.replay(ts[0], ts[0].kept.res, ts[0].kept.err)
			ts = ts[1:]
			continue
		} else if i > 0 {
			k = i
		}
		for _, t := range ts[:k] {
			t.job.Attempt = 1
		}
		return ts, k, true
	}
	return nil, 0, false
}

// groupEnd returns how many head jobs of ts (one key, stream order, the
// first not a possible redelivery) may form a group: up to the first job
// that may have run before, or the second of one caller's ID. Two jobs of
// one caller's ID (a retry stored while its first copy waited: the server
// de-duplicates no job of a batch) are one job, so the second starts the
// next group and is looked up by its ID after the first's outcome is
// kept: it is answered from it, never applied again.
func groupEnd(ts []*task) int {
	var ids map[string]bool
	k := 1
	for ; k < len(ts) && !ts[k].maybeDup; k++ {
		if !ts[k].explicit {
			continue
		}
		if ids == nil {
			ids = make(map[string]bool, len(ts))
			for _, t := range ts[:k] {
				if t.explicit {
					ids[t.job.ID] = true
				}
			}
		}
		if ids[ts[k].job.ID] {
			break
		}
		ids[ts[k].job.ID] = true
	}
	return k
}

// process runs one job to completion: handler, in-place retries with
// backoff, dead-lettering, result, reply and ack.
func (o *Owner) process(t *task) {
	if o.ctx.Err() != nil {
		return
	}
	if t.kept != nil {
		o.replay(t, t.kept.res, t.kept.err)
		return
	}
	if !t.lookedUp && (t.explicit || t.maybeDup && (o.cfg.StoreResults || t.batch != nil)) {
		// A job the caller may retry by ID (or a redelivery) that finished
		// before is answered from its kept outcome. A redelivered batch's
		// job is looked up whatever the worker keeps: one dead-lettered
		// while another job of its batch still ran has its outcome kept by
		// ID (task.deadInBatch), and nothing else stops it (its key's
		// state never held it).
		if res, rerr, ok := o.storedResult(t.job.ID, t.batch); ok {
			o.replay(t, res, rerr)
			return
		}
		if o.ctx.Err() != nil {
			o.stats.Unacked.Add(1)
			return
		}
		t.lookedUp = true
	}
	first := 1
	if t.maybeDup {
		// The job may have taken its previous owner down with it. Count
		// such starts across owners so a job that crashes every worker that
		// runs it is dead-lettered instead of blocking its key forever. The
		// first run is not counted (that would cost every job a round
		// trip), so such a job runs at most MaxDeliver+1 times.
		n, err := o.countStart(t.job.ID)
		if err != nil {
			o.log.Warn("count restarts", "job_id", t.job.ID, "err", err)
		}
		first = n + 1
		if first > o.cfg.MaxDeliver {
			err := core.Permanent(fmt.Errorf("keylane: job restarted %d times by new owners without finishing: its workers crashed or lost their leases", n))
			o.deadLetterTask(t, err, n)
			return
		}
	}
	stalled := false
	waits := 0 // tries that were not the job's fault: they only lengthen the backoff
	heldSaid := false
	// wholeFails counts an Applier's calls for the job that failed whole
	// (errApplyUnknown), neither for good nor for want of the database
	// (ErrUnavailable), the job alone in each but the first: see
	// failedWhole.
	wholeFails := 0
	for attempt := first; ; attempt++ {
		t.job.Attempt = attempt
		var res []byte
		var err error
		if attempt == first && t.firstErr != nil {
			// A group already ran this attempt.
			err, t.firstErr = t.firstErr, nil
		} else {
			res, err = o.callAlone(t.job, wholeFails > 0)
		}
		if o.ctx.Err() != nil {
			o.stats.Unacked.Add(1)
			return
		}
		if err == nil {
			if o.finish(t, res, nil, false) {
				o.stats.Succeeded.Add(1)
			}
			return
		}
		if errors.Is(err, core.ErrStaleFence) {
			o.stats.Stale.Add(1)
			o.log.Warn("stale fence: a newer owner wrote this key; stepping down", "job_id", t.job.ID, "err", err)
			o.abort()
			return
		}
		if errors.Is(err, core.ErrGap) {
			// Later jobs of the key were applied and this one never was: it
			// can no longer run in order. Say so loudly and to its caller.
			o.stats.Gaps.Add(1)
			o.stats.Failed.Add(1)
			o.log.Error("job skipped by a later job of its key; dead-lettering it", "job_id", t.job.ID, "seq", t.job.Seq, "err", err)
			err = core.Permanent(err)
			if o.deadLetter(t.msg, t.job, err, attempt) {
				o.finish(t, nil, err, true)
			}
			return
		}
		if errors.Is(err, core.ErrEpoch) {
			// The key's state belongs to another jobs stream. Nothing runs
			// until an operator adopts it; keep the job, and look again.
			o.log.Error("key's state was written under another jobs stream; holding the job until its epoch is adopted", "job_id", t.job.ID, "err", err)
			if !heldSaid {
				// Its caller is told now, not by its deadline.
				heldSaid = true
				o.sayHeld(t, err)
			}
			o.cfg.RefreshEpoch(o.ctx)
			attempt-- // not the job's fault: never dead-lettered for it
			waits++
		} else if errors.Is(err, core.ErrStateUnavailable) || errors.Is(err, errApplyUnknown) {
			// The state bucket did not take the read or write (a leader
			// election, a cut connection, a full store). Not the job's
			// fault: dead-lettering it would tell its caller "failed" for
			// a write that may have landed. Try again, with backoff, for
			// as long as the lease is trusted; the next attempt re-reads
			// the entry, which settles a write of unknown outcome. An
			// Applier's failed transaction is the same: the database's
			// record settles it.
			what := "state bucket unavailable"
			if errors.Is(err, errApplyUnknown) {
				what = "database transaction failed"
			}
			if errors.Is(err, errApplyUnknown) && errors.Is(err, core.ErrPermanent) {
				// The applier says no retry cures it until an operator acts
				// (a table dropped, a privilege revoked): not the job's
				// fault either, so the job is held, and said at ERROR.
				o.stats.ApplierRefusals.Add(1)
				o.log.Error("the database refuses the group's transaction for good (an operator's to fix); the job is held and tried again", "job_id", t.job.ID, "attempt", attempt, "err", err)
			} else {
				o.log.Warn(what+"; trying the job again", "job_id", t.job.ID, "attempt", attempt, "err", err)
			}
			if errors.Is(err, errApplyUnknown) && !errors.Is(err, core.ErrPermanent) && !errors.Is(err, core.ErrUnavailable) {
				if wholeFails++; wholeFails > o.cfg.MaxDeliver && o.failedWhole(t, err, wholeFails) {
					return
				}
			}
			attempt--
			waits++
		} else {
			if errors.Is(err, core.ErrPermanent) || attempt >= o.cfg.MaxDeliver {
				o.deadLetterTask(t, err, attempt)
				return
			}
			o.stats.Failed.Add(1)
			o.log.Warn("job failed; retrying", "job_id", t.job.ID, "key", t.job.Key, "attempt", attempt, "err", err)
		}
		if !stalled {
			// Keep a few of the key's queued jobs; hand the rest back so
			// they do not hold the partition's window while this retries.
			stalled = true
			defer o.ln.stall(t.job.Key, false)
			for _, bt := range o.ln.stall(t.job.Key, true) {
				o.handBack(bt, true)
			}
		}
		// The backoff does not hold a runner: other keys run meanwhile. It
		// ends early when the tenure does, or when a re-sync drops the
		// lanes (the new consumer delivers the job again): a failing job
		// must not hold up a re-sync of its partition.
		if !o.ln.pause(o.ctx, o.cfg.Backoff(max(attempt+waits, 1))) {
			o.stats.Unacked.Add(1)
			return
		}
	}
}

// deadLetterTask dead-letters t, which failed with why after attempts,
// and answers its caller — unless the worker's Applier keeps a record
// (RecordReader) that says t committed: then t is answered and acked with
// its recorded result, for its effect is in the database (a commit whose
// owners all died before the ack, a failure after a commit of unknown
// fate). A record that cannot be read is read again with backoff while the
// tenure lasts; t is never dead-lettered on a guess.
func (o *Owner) deadLetterTask(t *task, why error, attempts int) {
	if res, done, ok := o.readRecord(t); !ok {
		o.stats.Unacked.Add(1)
		return
	} else if done {
		o.log.Warn("job not dead-lettered: the database's record says it committed; answering it from there", "job_id", t.job.ID, "attempts", attempts, "err", why)
		o.stats.FromResults.Add(1)
		if o.finish(t, res, nil, false) {
			o.stats.Succeeded.Add(1)
		}
		return
	}
	o.stats.Failed.Add(1)
	if o.deadLetter(t.msg, t.job, why, attempts) {
		o.finish(t, nil, why, true)
	}
}

// failedWhole settles t, whose Applier's call failed whole n times, the
// last n-1 with t alone in its transaction: past MaxDeliver of them, a
// database that still answers the record's read is not down, and the
// job's own transaction is what fails (a Handler that swallowed a
// database error, say): t is dead-lettered, for good, unless the record
// says it committed (then it is answered from there). It reports false,
// t to be tried again, when the Applier keeps no record (RecordReader: a
// commit of unknown fate cannot be told from a failure) or the record
// cannot be read (an outage is not the job's fault).
func (o *Owner) failedWhole(t *task, why error, n int) bool {
	rr, is := o.cfg.Applier.(core.RecordReader)
	if !is {
		return false
	}
	ctx, cancel := context.WithTimeout(o.ctx, core.ResultLookupTimeout)
	rec, err := rr.ReadRecord(ctx, o.topo.Names.Namespace, []string{t.job.ID})
	cancel()
	if err != nil {
		o.log.Warn("the database's record is unread; the job's transaction is tried again", "job_id", t.job.ID, "err", err)
		return false
	}
	if res, done := rec[t.job.ID]; done {
		o.stats.FromResults.Add(1)
		if o.finish(t, res, nil, false) {
			o.stats.Succeeded.Add(1)
		}
		return true
	}
	o.stats.Failed.Add(1)
	err = core.Permanent(fmt.Errorf("keylane: the job's transaction failed whole %d times, %d of them with the job alone, while the database answered: %w", n, n-1, why))
	o.log.Error("job's transaction fails whatever is tried; dead-lettering it", "job_id", t.job.ID, "err", err)
	if o.deadLetter(t.msg, t.job, err, n) {
		o.finish(t, nil, err, true)
	}
	return true
}

// readRecord reads the Applier's record of t's job when the Applier keeps
// one (RecordReader): done with its recorded result when it committed.
// Without such an Applier it reports not done. ok is false only when the
// tenure ended before the record could be read.
func (o *Owner) readRecord(t *task) (res []byte, done, ok bool) {
	rr, is := o.cfg.Applier.(core.RecordReader)
	if !is {
		return nil, false, true
	}
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(o.ctx, core.ResultLookupTimeout)
		rec, err := rr.ReadRecord(ctx, o.topo.Names.Namespace, []string{t.job.ID})
		cancel()
		if err == nil {
			res, done = rec[t.job.ID]
			return res, done, true
		}
		o.log.Warn("the database's record of a job to dead-letter is unread; trying again", "job_id", t.job.ID, "try", try, "err", err)
		if !o.ln.pause(o.ctx, o.cfg.Backoff(try)) {
			return nil, false, false
		}
	}
}

// startsKey is the results-bucket key counting a redelivered job's starts.
// '/' never occurs in a job ID, so it cannot collide with a stored result.
// The results bucket has a TTL, so a counter (and the purge marker that
// forgetting it leaves) expires with it instead of staying for ever, as it
// did in the TTL-less state bucket.
func startsKey(jobID string) string {
	return "starts/" + base64.RawURLEncoding.EncodeToString([]byte(jobID))
}

// countStart records one more start of a possibly redelivered job and
// returns how many starts were recorded before this one (under earlier
// owners). Only redelivered jobs pay this round trip. The counter is read
// from the results stream's leader: the compare-and-set would refuse a
// count read from a lagging replica, but every retry could read the same
// replica again until the loop gives up, and a count not taken lets a job
// that crashes its workers run again instead of being dead-lettered.
func (o *Owner) countStart(jobID string) (int, error) {
	ctx, cancel := context.WithTimeout(o.ctx, core.CounterTimeout)
	defer cancel()
	kv, k := o.topo.Results, startsKey(jobID)
	stream, subject := "KV_"+o.topo.Names.Results(), "$KV."+o.topo.Names.Results()+"."+k
	var n int
	err := statestore.Loop(ctx, func(bool) error {
		n = 0
		var rev uint64
		sm, err := leaderGet(ctx, o.nc, stream, subject)
		switch {
		case err == nil && !kvRemoved(sm.Header):
			n, _ = strconv.Atoi(string(sm.Data))
			rev = sm.Seq
		case err == nil, errors.Is(err, errNoEntry):
		default:
			return err
		}
		_, err = statestore.Put(ctx, kv, k, rev, []byte(strconv.Itoa(n+1)))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("keylane: restart counter: %w", err)
	}
	return n, nil
}

// forgetStarts drops a finished job's start counter. It runs only once the
// job was acked here; a crash leaves the counter for the next owner.
func (o *Owner) forgetStarts(jobID string) {
	ctx, cancel := context.WithTimeout(context.Background(), core.CounterTimeout)
	defer cancel()
	_ = o.topo.Results.Purge(ctx, startsKey(jobID))
}

// callAlone runs job once through the handler, reducer or Applier; alone, an Applier's job is applied in a transaction
// of its own (applyGroupDB).
func (o *Owner) callAlone(job core.Job, alone bool) (res []byte, err error) {
	if o.cfg.Reducer != nil {
		return o.reduceOne(job)
	}
	if o.cfg.Applier != nil {
		return o.applyOne(job, alone)
	}
	o.stats.Runs.Add(1)
	defer o.observeRun(o.now())
	ctx, span := traceOf(job).run(o.ctx, job)
	defer span.end(&err) // after the recover below has set err
	start := o.jobClock()
	defer func() { o.logRan(&job, start, err) }() // after the recover below
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("keylane: handler panicked: %v", r)
		}
	}()
	return o.cfg.Handler.Handle(ctx, job)
}
