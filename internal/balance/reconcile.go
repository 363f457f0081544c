package balance

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
)

// The balancer's decisions: reconcile compares the assignment with what the
// worker owns and acquires or hands over (balance.go keeps the views of
// members and lease holders it decides from).

func (b *Balancer[O]) reconcile() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopping || !b.memberv.synced || !b.leasev.synced {
		return
	}
	me := b.cfg.ID
	ttl := b.cfg.Lease.TTL
	now := time.Now()
	for m := range b.members {
		if m != me && now.Sub(b.memberSeen[m]) > staleAfter(ttl) {
			delete(b.members, m) // expired without a marker
		}
	}
	members := make([]string, 0, len(b.members)+1)
	for m := range b.members {
		members = append(members, m)
	}
	if !b.members[me] {
		members = append(members, me)
	}
	slices.Sort(members)
	current := make([]string, len(b.holders))
	for p := range b.holders {
		if h := b.holders[p]; !h.free && b.owners[p] == nil && !h.seen.IsZero() && now.Sub(h.seen) > staleAfter(ttl) {
			b.holders[p] = holder{free: true, since: h.seen.Add(ttl)}
		}
		if h := b.holders[p]; !h.free {
			current[p] = h.id
		}
		if o := b.owners[p]; o != nil && current[p] == me && isClosed(o.l.Done()) {
			current[p] = "" // lost, even while its handlers wind down
		}
	}
	var barred func(int, string) bool
	if len(b.stuck) > 0 {
		barred = b.barred
	}
	desired := partition.Assign(len(b.holders), members, current, barred)
	for p := range b.holders {
		if o := b.owners[p]; o != nil {
			if b.lapse(p, o, now) {
				continue
			}
			if desired[p] == me {
				o.orphan = false // ours now by the rule: it stays without a hold
				continue
			}
			// An orphan we took because its desired owner did not claim it
			// stays a while: handing it straight back to an owner that
			// cannot take it would bounce it every TTL.
			settled := !o.orphan || now.Sub(o.since) >= orphanHold*ttl
			if b.members[desired[p]] && settled {
				o.owner.HandOver()
			}
			continue
		}
		if b.acquiring[p] {
			continue
		}
		h := b.holders[p]
		if !h.free {
			continue
		}
		if desired[p] == me || now.Sub(h.since) >= ttl {
			b.acquiring[p] = true
			b.wg.Add(1)
			go b.acquire(p, desired[p] != me)
		}
	}
}

// nextBackoff doubles d from ttl/20 up to ttl and returns it with up to
// half of it taken off at random, so workers hit by one fault do not retry
// in step.
func nextBackoff(d, ttl time.Duration) time.Duration {
	lo := max(ttl/20, 10*time.Millisecond)
	d = min(max(2*d, lo), ttl)
	return d - rand.N(d/2+1)
}

// orphanHold is how many TTLs a worker keeps an orphan partition before
// handing it to its desired owner.
const orphanHold = 3

func (b *Balancer[O]) acquire(p int, orphan bool) {
	defer b.wg.Done()
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.Lease.TTL)
	l, err := lease.Acquire(ctx, b.cfg.Leases, b.cfg.LeaseKey(p), b.cfg.Lease)
	cancel()
	b.mu.Lock()
	delete(b.acquiring, p)
	if err != nil {
		b.mu.Unlock()
		if !errors.Is(err, lease.ErrHeld) && b.ctx.Err() == nil {
			b.cfg.Log.Warn("acquire partition", "partition", p, "err", err)
		}
		return
	}
	if b.stopping {
		b.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), b.cfg.Lease.TTL)
		if err := l.Release(rctx); err != nil {
			b.cfg.Log.Warn("release of a partition acquired while stopping", "partition", p, "err", err)
		}
		cancel()
		return
	}
	o := &held[O]{owner: b.cfg.NewOwner(p, l), l: l}
	o.orphan, o.since = orphan, time.Now()
	b.owners[p] = o
	// Seen now, not never: the stale rule passes over a holder never
	// seen, so if the lease watch delivered nothing more of p (stalled,
	// or it delivered our Create before this line), a tenure that ends
	// without the watch showing its delete or expiry (a lapse) would
	// leave p held by us in this view for good, and this worker
	// would never take it again: Owned 0, nothing acquired, nothing lost
	// or stuck (a run of TestOwnerCreatesItsConsumerThroughASlowMetaLeader
	// before this fix stalled so for its whole minute: the lapsed
	// tenure's delete landed, the watch never showed it).
	b.holders[p] = holder{id: b.cfg.ID, seen: time.Now()}
	b.mu.Unlock()
	b.cfg.Acquired()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		o.owner.Run()
		b.mu.Lock()
		if b.owners[p] == o {
			delete(b.owners, p)
		}
		delete(b.lapsed, o)
		b.mu.Unlock()
		b.poke()
	}()
}

// Owned returns the partitions this worker owns now, in order: those
// whose lease it still trusts, not those whose owner winds down after the
// lease ended or whose trust window closed without a renew (Lease.Trusted
// reads the clock: a NATS outage that stops the renews drops them at the
// deadline, not once the owner's release, bounded by a TTL, gave up).
func (b *Balancer[O]) Owned() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	ps := make([]int, 0, len(b.owners))
	for p, o := range b.owners {
		if !o.l.Trusted() {
			continue // lost or lapsed: not ours, even while its handlers wind down
		}
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// Held is one partition whose owner runs now, as Balancer.Held reports it.
type Held[O Owner] struct {
	Partition int
	Owner     O
	// Since is when the balancer took the lease.
	Since time.Time
}

// Held returns the partitions whose owner runs now, in no order, with
// their owners: those whose lease ended while the owner winds down too.
func (b *Balancer[O]) Held() []Held[O] {
	b.mu.Lock()
	defer b.mu.Unlock()
	hs := make([]Held[O], 0, len(b.owners))
	for p, o := range b.owners {
		hs = append(hs, Held[O]{Partition: p, Owner: o.owner, Since: o.since})
	}
	return hs
}

// Stop leaves the member set, hands every owned partition over (aborting
// those still draining when ctx ends), and waits for every goroutine. A
// second Stop waits for the first.
func (b *Balancer[O]) Stop(ctx context.Context) error {
	b.mu.Lock()
	if b.stopping { // stopped by a topology reload already
		b.mu.Unlock()
		b.wg.Wait()
		return nil
	}
	b.stopping = true
	owners := make([]*held[O], 0, len(b.owners))
	for _, o := range b.owners {
		owners = append(owners, o)
	}
	member := b.member
	b.mu.Unlock()

	// Leave first, so the others recompute the desired owners while we drain.
	rerr := member.Release(ctx)
	for _, o := range owners {
		o.owner.HandOver()
	}
	for _, o := range owners {
		select {
		case <-o.owner.Done():
		case <-ctx.Done():
			o.owner.Abort()
			<-o.owner.Done()
		}
	}
	b.cancel()
	b.wg.Wait()
	if rerr != nil && !errors.Is(rerr, lease.ErrLost) && !errors.Is(rerr, lease.ErrReleased) {
		return rerr
	}
	return nil
}
