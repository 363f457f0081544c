package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// balancer decides which partitions this worker should own. The desired
// owner of partition p is the live member with the highest rendezvous hash
// (partition.Owner). The balancer acquires free partitions it is desired
// for, hands over those it owns but is no longer desired for, and takes an
// orphan partition (free for a whole TTL with its desired owner not claiming
// it). It learns the member set and the lease holders by watching the two
// buckets, and re-checks every TTL/3 as a safety net.
type balancer struct {
	w      *Worker
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}

	mu        sync.Mutex
	member    *lease.Lease
	members   map[string]bool
	holders   []holder
	owners    map[int]*owner
	acquiring map[int]bool
	synced    int // watchers that have delivered their initial values
	stopping  bool
}

type holder struct {
	id    string
	free  bool
	since time.Time
}

func startBalancer(ctx context.Context, w *Worker) (*balancer, error) {
	n := w.topo.Partitions
	b := &balancer{
		w: w, kick: make(chan struct{}, 1),
		members: map[string]bool{}, holders: make([]holder, n),
		owners: map[int]*owner{}, acquiring: map[int]bool{},
	}
	now := time.Now()
	for p := range b.holders {
		b.holders[p] = holder{free: true, since: now}
	}
	// A worker restarted with the same ID finds its old entry until it
	// expires: wait for it, but not for a live twin.
	rctx, cancel := context.WithTimeout(ctx, 2*w.cfg.Topology.LeaseTTL)
	m, err := lease.Campaign(rctx, w.topo.Members, w.cfg.ID, w.leaseConfig())
	cancel()
	if err != nil {
		return nil, fmt.Errorf("keylane: register member %s (is another worker running with this ID?): %w", w.cfg.ID, err)
	}
	b.member = m
	// The balancer outlives Start's ctx: it stops with Stop.
	b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(ctx))
	mw, err := w.topo.Members.WatchAll(b.ctx)
	if err != nil {
		b.cancel()
		_ = m.Release(ctx)
		return nil, err
	}
	lw, err := w.topo.Leases.WatchAll(b.ctx)
	if err != nil {
		b.cancel()
		_ = mw.Stop()
		_ = m.Release(ctx)
		return nil, err
	}
	b.wg.Add(3)
	go b.watch(mw, b.onMember)
	go b.watch(lw, b.onLease)
	go b.loop()
	return b, nil
}

func (b *balancer) watch(kw jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) {
	defer b.wg.Done()
	defer func() { _ = kw.Stop() }()
	for {
		select {
		case <-b.ctx.Done():
			return
		case e, ok := <-kw.Updates():
			if !ok {
				return
			}
			b.mu.Lock()
			if e == nil {
				b.synced++
			} else {
				apply(e)
			}
			b.mu.Unlock()
			b.poke()
		}
	}
}

// onMember and onLease run with b.mu held.
func (b *balancer) onMember(e jetstream.KeyValueEntry) {
	if e.Operation() == jetstream.KeyValuePut {
		b.members[e.Key()] = true
	} else {
		delete(b.members, e.Key())
	}
}

func (b *balancer) onLease(e jetstream.KeyValueEntry) {
	var p int
	if _, err := fmt.Sscanf(e.Key(), "p.%d", &p); err != nil || p < 0 || p >= len(b.holders) {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		b.holders[p] = holder{free: true, since: time.Now()}
		return
	}
	info, err := lease.Decode(e.Value())
	if err != nil {
		b.w.log.Warn("undecodable lease entry", "partition", p, "err", err)
		return
	}
	b.holders[p] = holder{id: info.Holder}
}

func (b *balancer) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

func (b *balancer) loop() {
	defer b.wg.Done()
	t := time.NewTicker(b.w.cfg.Topology.LeaseTTL / 3)
	defer t.Stop()
	for {
		b.mu.Lock()
		memberDone := b.member.Done()
		if b.stopping {
			memberDone = nil // released on purpose: do not spin on it
		}
		b.mu.Unlock()
		select {
		case <-b.ctx.Done():
			return
		case <-b.kick:
		case <-t.C:
		case <-memberDone:
			b.reregister()
		}
		b.reconcile()
	}
}

// reregister puts the worker back into the member set after its entry was
// lost (for example while the process was paused).
func (b *balancer) reregister() {
	b.mu.Lock()
	stopping := b.stopping
	b.mu.Unlock()
	if stopping {
		return
	}
	b.w.log.Warn("member entry lost; registering again", "err", b.member.Err())
	ctx, cancel := context.WithTimeout(b.ctx, 2*b.w.cfg.Topology.LeaseTTL)
	defer cancel()
	m, err := lease.Campaign(ctx, b.w.topo.Members, b.w.cfg.ID, b.w.leaseConfig())
	if err != nil {
		b.w.log.Error("register member again", "err", err)
		return
	}
	b.mu.Lock()
	b.member = m
	b.mu.Unlock()
}

func (b *balancer) reconcile() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopping || b.synced < 2 {
		return
	}
	me := b.w.cfg.ID
	members := make([]string, 0, len(b.members)+1)
	for m := range b.members {
		members = append(members, m)
	}
	if !b.members[me] {
		members = append(members, me)
	}
	slices.Sort(members)
	ttl := b.w.cfg.Topology.LeaseTTL
	now := time.Now()
	for p := range b.holders {
		desired := partition.Owner(p, members)
		if o := b.owners[p]; o != nil {
			// An orphan we took because its desired owner did not claim it
			// stays a while: handing it straight back to an owner that
			// cannot take it would bounce it every TTL.
			settled := !o.orphan || now.Sub(o.since) >= orphanHold*ttl
			if desired != me && b.members[desired] && settled {
				o.handOver()
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
		if desired == me || now.Sub(h.since) >= ttl {
			b.acquiring[p] = true
			b.wg.Add(1)
			go b.acquire(p, desired != me)
		}
	}
}

// orphanHold is how many TTLs a worker keeps an orphan partition before
// handing it to its desired owner.
const orphanHold = 3

func (b *balancer) acquire(p int, orphan bool) {
	defer b.wg.Done()
	ctx, cancel := context.WithTimeout(b.ctx, b.w.cfg.Topology.LeaseTTL)
	l, err := lease.Acquire(ctx, b.w.topo.Leases, b.w.topo.Names.LeaseKey(p), b.w.leaseConfig())
	cancel()
	b.mu.Lock()
	delete(b.acquiring, p)
	if err != nil {
		b.mu.Unlock()
		if !errors.Is(err, lease.ErrHeld) && b.ctx.Err() == nil {
			b.w.log.Warn("acquire partition", "partition", p, "err", err)
		}
		return
	}
	if b.stopping {
		b.mu.Unlock()
		_ = l.Release(context.WithoutCancel(b.ctx))
		return
	}
	o := newOwner(b.w, p, l)
	o.orphan, o.since = orphan, time.Now()
	b.owners[p] = o
	b.holders[p] = holder{id: b.w.cfg.ID}
	b.mu.Unlock()
	b.w.stats.acquired.Add(1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		o.run()
		b.mu.Lock()
		if b.owners[p] == o {
			delete(b.owners, p)
		}
		b.mu.Unlock()
		b.poke()
	}()
}

func (b *balancer) owned() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	ps := make([]int, 0, len(b.owners))
	for p := range b.owners {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// stop leaves the member set, hands every owned partition over (aborting
// those still draining when ctx ends), and waits for every goroutine.
func (b *balancer) stop(ctx context.Context) error {
	b.mu.Lock()
	b.stopping = true
	owners := make([]*owner, 0, len(b.owners))
	for _, o := range b.owners {
		owners = append(owners, o)
	}
	member := b.member
	b.mu.Unlock()

	// Leave first, so the others recompute the desired owners while we drain.
	rerr := member.Release(ctx)
	for _, o := range owners {
		o.handOver()
	}
	for _, o := range owners {
		select {
		case <-o.done:
		case <-ctx.Done():
			o.abort()
			<-o.done
		}
	}
	b.cancel()
	b.wg.Wait()
	if rerr != nil && !errors.Is(rerr, lease.ErrLost) && !errors.Is(rerr, lease.ErrReleased) {
		return rerr
	}
	return nil
}
