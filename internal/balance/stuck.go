package balance

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/lease"
)

// barred reports whether worker id has a stuck mark on p, so that it may
// neither keep nor receive p. It runs with b.mu held.
func (b *Balancer[O]) barred(p int, id string) bool { return b.stuck[p][id] }

// lapse reports whether o's lease has ended while o still runs. Once it
// has run stuckAfter past the end, lapse counts and logs it and starts
// holdStuckMark. It runs with b.mu held.
func (b *Balancer[O]) lapse(p int, o *held[O], now time.Time) bool {
	if !isClosed(o.l.Done()) {
		return false
	}
	lp := b.lapsed[o]
	if lp == nil {
		b.lapsed[o] = &lapse{since: now}
		return true
	}
	if lp.marked || now.Sub(lp.since) < stuckAfter(b.cfg.Lease.TTL) {
		return true
	}
	lp.marked = true
	b.cfg.Stuck()
	b.cfg.Log.Warn("partition lease ended but its handlers have not returned (do they ignore their context?); publishing a stuck mark so another worker owns it meanwhile",
		"partition", p, "stuck_for", now.Sub(lp.since).Round(time.Millisecond), "err", o.l.Err())
	b.wg.Add(1)
	go b.holdStuckMark(p, o, lp.since)
	return true
}

// stuckAfter is how long an owner may keep running after its lease ended
// before its worker marks the partition stuck. An owner whose handlers
// honour their context returns within milliseconds; only a release that
// cannot reach the server takes longer, and then no mark can be written
// either.
func stuckAfter(ttl time.Duration) time.Duration { return ttl / 3 }

// StuckKey is the lease-bucket key of worker id's stuck mark on partition
// p. Worker IDs hold no '.', and the key does not start with "p.", so
// older balancers ignore it.
func StuckKey(p int, id string) string { return "s." + strconv.Itoa(p) + "." + id }

func parseStuckKey(key string) (p int, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, "s.")
	if !ok {
		return 0, "", false
	}
	ps, id, ok := strings.Cut(rest, ".")
	if !ok || id == "" {
		return 0, "", false
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 0 {
		return 0, "", false
	}
	return p, id, true
}

// holdStuckMark keeps worker's stuck mark on p until o returns: it takes
// the mark's lease (again, with backoff, if it is lost) and releases it
// when o is done. It logs at Error, at doubling intervals, how long o has
// been stuck.
func (b *Balancer[O]) holdStuckMark(p int, o *held[O], since time.Time) {
	defer b.wg.Done()
	ttl := b.cfg.Lease.TTL
	key := StuckKey(p, b.cfg.ID)
	var mark *lease.Lease
	defer func() {
		if mark != nil {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), ttl)
			if err := mark.Release(ctx); err != nil && !errors.Is(err, lease.ErrLost) {
				b.cfg.Log.Warn("release stuck mark", "partition", p, "err", err)
			}
			cancel()
		}
		b.poke()
	}()
	remind := time.NewTimer(4 * stuckAfter(ttl))
	defer remind.Stop()
	every := 4 * stuckAfter(ttl)
	retry := time.NewTimer(0)
	defer retry.Stop()
	var backoff time.Duration
	for {
		var markDone <-chan struct{}
		if mark != nil {
			markDone = mark.Done()
		}
		select {
		case <-o.owner.Done():
			b.cfg.Log.Warn("stuck partition's handlers returned; giving the partition back to balancing",
				"partition", p, "stuck_for", time.Since(since).Round(time.Millisecond))
			return
		case <-b.ctx.Done():
			return
		case <-remind.C:
			b.cfg.Log.Error("partition handlers still running after the lease ended",
				"partition", p, "stuck_for", time.Since(since).Round(time.Millisecond))
			every = min(2*every, 5*time.Minute)
			remind.Reset(every)
		case <-markDone:
			b.cfg.Log.Warn("stuck mark lost; publishing it again", "partition", p, "err", mark.Err())
			mark = nil
			backoff = nextBackoff(backoff, ttl)
			retry.Reset(backoff)
		case <-retry.C:
			ctx, cancel := context.WithTimeout(b.ctx, ttl)
			l, err := lease.Acquire(ctx, b.cfg.Leases, key, b.cfg.Lease)
			cancel()
			if err != nil {
				// Held: our mark from before a restart, which expires.
				backoff = nextBackoff(backoff, ttl)
				b.cfg.Log.Warn("publish stuck mark", "partition", p, "err", err, "retry_in", backoff)
				retry.Reset(backoff)
				continue
			}
			mark, backoff = l, 0
		}
	}
}
