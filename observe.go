package keylane

import (
	"slices"
	"time"
)

// ClientObserver receives a client's measurements, for metrics; package
// metrics turns them into Prometheus counters and histograms. Set it in
// ClientConfig.Observer. Every field is optional; the functions must be
// safe for concurrent use and must not block. A client with no Observer
// reads no clock for it.
type ClientObserver struct {
	// Submitted is called when Submit returns, with how long it took and
	// its error (ErrDuplicate for an ID stored before).
	Submitted func(took time.Duration, err error)
	// Called is called when Call returns (also through CallJSON and the
	// other typed helpers), with how long it took and its error.
	Called func(took time.Duration, err error)
	// SubmittedMany is called when SubmitMany returns, with how long it
	// took, how many jobs it was given, and how many of them are not known
	// to be stored: those refused or failed, or all of them if ctx ended.
	SubmittedMany func(took time.Duration, jobs, failed int)
}

// leaseRenewed is the lease watchdog's hook: it counts failed renews
// (Stats.RenewFailures) and calls the observer's LeaseRenewed, if any.
func (w *Worker) leaseRenewed() func(time.Duration, error) {
	var observe func(time.Duration, error)
	if w.cfg.Observer != nil {
		observe = w.cfg.Observer.LeaseRenewed
	}
	return func(took time.Duration, err error) {
		if err != nil {
			w.stats.renewFailures.Add(1)
		}
		if observe != nil {
			observe(took, err)
		}
	}
}

// Tenure is one partition a worker owns now, as Worker.Tenures reports it.
type Tenure struct {
	Partition int
	// Fence is the lease's fencing token.
	Fence uint64
	// Since is when the lease was taken.
	Since time.Time
	// Backlog counts the partition's stored jobs not yet delivered to this
	// worker, as the server reported with the last delivery (the
	// consumer's pending count), a batch message counted as the jobs it
	// carries (read beside the fetch loop, so a batch stored since the
	// last read counts one until the next).
	// It is 0 before the first delivery, and stays as it was while no job
	// is delivered (a worker whose in-flight window is full of jobs that
	// do not finish).
	Backlog uint64
	// InFlight counts the jobs fetched and not yet finished, held in this
	// worker's memory: of one-job messages at most MaxInFlight, plus the
	// head job of each key that retries it (at most Concurrency); jobs of
	// batch messages besides, bounded by MaxPending messages.
	InFlight int
	// HandedBack counts the jobs a failing key handed back to the server
	// that have not come back yet. It returns to 0 once no key's head
	// fails and the server has delivered them again (see jetstream/doc.go,
	// "A failing key does not hold its partition").
	HandedBack int
	// TrustedFor is how long the lease stays trusted without another
	// successful renew (0 once it ended): the trust window's headroom.
	TrustedFor time.Duration
}

// Tenures returns the partitions this worker owns now (as Owned: their
// lease still trusted), by partition, with what the worker knows of
// each: it asks the server nothing. Safe for
// concurrent use; nil before Start.
func (w *Worker) Tenures() []Tenure {
	w.mu.Lock()
	bal := w.bal
	w.mu.Unlock()
	if bal == nil {
		return nil
	}
	held := bal.Held()
	ts := make([]Tenure, 0, len(held))
	for _, h := range held {
		p, o, l := h.Partition, h.Owner, h.Owner.Lease()
		if !l.Trusted() {
			continue // lost, or its trust window closed: not ours, even while its handlers wind down
		}
		t := Tenure{Partition: p, Fence: l.Fence(), Since: h.Since, Backlog: o.Backlog(), TrustedFor: max(time.Until(l.TrustDeadline()), 0)}
		t.InFlight, t.HandedBack = o.InFlight()
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b Tenure) int { return a.Partition - b.Partition })
	return ts
}

// now returns the time when the client measures anything, and the zero
// time when it does not.
func (c *Client) now() time.Time {
	if c.obs == nil {
		return time.Time{}
	}
	return time.Now()
}

// observeSubmit reports a Submit that started at start (from c.now).
func (c *Client) observeSubmit(start time.Time, err *error) {
	if c.obs != nil && c.obs.Submitted != nil {
		c.obs.Submitted(time.Since(start), *err)
	}
}

// observeCall reports a Call that started at start (from c.now).
func (c *Client) observeCall(start time.Time, err *error) {
	if c.obs != nil && c.obs.Called != nil {
		c.obs.Called(time.Since(start), *err)
	}
}

// observeSubmitMany reports a SubmitMany that started at start.
func (c *Client) observeSubmitMany(start time.Time, out *[]Submitted, err *error) {
	if c.obs == nil || c.obs.SubmittedMany == nil {
		return
	}
	failed := 0
	for _, s := range *out {
		if s.Err != nil {
			failed++
		}
	}
	if *err != nil {
		failed = len(*out) // ctx ended: none is known to be stored
	}
	c.obs.SubmittedMany(time.Since(start), len(*out), failed)
}
