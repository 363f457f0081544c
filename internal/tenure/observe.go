package tenure

import "time"

// The tenure's measuring sites (Config.Observer, a WorkerObserver): a
// tenure with no Observer reads no clock and allocates nothing for them.

// now is the tenure's Worker.now: the zero time when nothing is observed.
func (o *Owner) now() time.Time {
	if o.cfg.Observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// sinceStored is the time since a job was stored, never negative.
func sinceStored(stored time.Time) time.Duration {
	return max(time.Since(stored), 0)
}

// observeQueueWait wraps a partition's run function so that every task
// taken to run the first time reports its queue wait. Without a QueueWait
// observer it returns run itself.
func (o *Owner) observeQueueWait(run func([]*task)) func([]*task) {
	obs := o.cfg.Observer
	if obs == nil || obs.QueueWait == nil {
		return run
	}
	return func(ts []*task) {
		for _, t := range ts {
			if !t.started {
				t.started = true
				obs.QueueWait(o.p, sinceStored(t.stored))
			}
		}
		run(ts)
	}
}

// observeRun reports a handler run that started at start (from w.now).
func (o *Owner) observeRun(start time.Time) {
	if obs := o.cfg.Observer; obs != nil && obs.Run != nil {
		obs.Run(o.p, time.Since(start))
	}
}

// observeGroup reports a reducer group that started at start (from
// w.now): its run time, and its size if its write landed.
func (o *Owner) observeGroup(start time.Time, n *int, werr *error) {
	obs := o.cfg.Observer
	if obs == nil {
		return
	}
	if obs.Run != nil {
		obs.Run(o.p, time.Since(start))
	}
	if obs.Group != nil && *werr == nil && *n > 0 {
		obs.Group(o.p, *n)
	}
}

// observeSettled reports a job acked with its outcome.
func (o *Owner) observeSettled(t *task) {
	if obs := o.cfg.Observer; obs != nil && obs.Settled != nil {
		obs.Settled(o.p, sinceStored(t.stored))
	}
}
