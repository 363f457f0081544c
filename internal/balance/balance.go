package balance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// Balancer decides which partitions this worker should own, and starts,
// hands over and aborts their owners (Config.NewOwner). The design notes
// are in the package doc (doc.go). Create it with Start; Stop ends it. Its
// methods are safe for concurrent use.
type Balancer[O Owner] struct {
	cfg    Config[O]
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{}

	mu      sync.Mutex
	member  *lease.Lease
	memberv *view // the members bucket
	leasev  *view // the leases bucket
	members map[string]bool
	holders []holder
	// memberSeen is when each member's last write was seen.
	memberSeen map[string]time.Time
	stuck      map[int]map[string]bool // partition → workers with a stuck mark on it
	owners     map[int]*held[O]
	lapsed     map[*held[O]]*lapse // our owners whose lease ended while they still run
	acquiring  map[int]bool
	stopping   bool
}

// view is a bucket the balancer follows through a KV watch. A watch's
// channel closes when nats.go gives up on its ordered consumer (say the
// consumer cannot be re-created after a server restart or while the
// bucket's stream is missing); the balancer then watches again, with
// backoff, and relearns the bucket from the new watch's initial values.
// Until they are in, it does not reconcile.
type view struct {
	kv     jetstream.KeyValue
	reset  func()                        // forgets what the bucket said; b.mu held
	apply  func(jetstream.KeyValueEntry) // learns one entry; b.mu held
	synced bool                          // the current watch delivered its initial values; b.mu
}

// held is an owner of ours, with its lease and what the balancer knows of
// its tenure.
type held[O Owner] struct {
	owner  O
	l      *lease.Lease
	orphan bool      // taken because its desired owner did not claim it
	since  time.Time // when the lease was taken
}

// lapse is an owner of ours whose lease ended before its run returned.
type lapse struct {
	since  time.Time // when the balancer first saw the lease ended
	marked bool      // holdStuckMark runs for it
}

type holder struct {
	id    string
	free  bool
	since time.Time // free since
	seen  time.Time // when its last write was seen
}

// staleAfter is how long a lease or member entry may go unrewritten before
// the balancer takes it as expired even without the server's expiry
// marker. Live holders rewrite every TTL/3; a server that expires entries
// while it recovers its store after a restart writes no marker, so
// watchers would otherwise wait for ever on a dead worker's entries.
func staleAfter(ttl time.Duration) time.Duration { return ttl + ttl/2 }

// Start registers the worker as a member (waiting up to two TTLs for an
// entry of its own ID left by a crashed run to expire, never for a live
// twin), starts watching the members and leases buckets and balancing,
// and returns once it is registered; partitions are taken in the
// background. The balancer outlives ctx: it runs until Stop.
func Start[O Owner](ctx context.Context, cfg Config[O]) (*Balancer[O], error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	n := cfg.Partitions
	b := &Balancer[O]{
		cfg: cfg, kick: make(chan struct{}, 1),
		members: map[string]bool{}, memberSeen: map[string]time.Time{}, holders: make([]holder, n), stuck: map[int]map[string]bool{},
		owners: map[int]*held[O]{}, acquiring: map[int]bool{}, lapsed: map[*held[O]]*lapse{},
	}
	b.forgetLeases()
	// A worker restarted with the same ID finds its old entry until it
	// expires: wait for it, but not for a live twin.
	rctx, cancel := context.WithTimeout(ctx, 2*cfg.Lease.TTL)
	m, err := lease.Campaign(rctx, cfg.Members, cfg.ID, cfg.Lease)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("keylane: register member %s (is another worker running with this ID?): %w", cfg.ID, err)
	}
	b.member = m
	// The balancer outlives Start's ctx: it stops with Stop.
	b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(ctx))
	b.memberv = &view{kv: cfg.Members, reset: func() { clear(b.members) }, apply: b.onMember}
	b.leasev = &view{kv: cfg.Leases, reset: b.forgetLeases, apply: b.onLease}
	mw, mstop, err := b.openAtStart(ctx, b.memberv)
	if err != nil {
		b.cancel()
		_ = m.Release(ctx)
		return nil, err
	}
	lw, lstop, err := b.openAtStart(ctx, b.leasev)
	if err != nil {
		mstop()
		b.cancel()
		_ = m.Release(ctx)
		return nil, err
	}
	b.wg.Add(3)
	go b.follow(b.memberv, mw, mstop)
	go b.follow(b.leasev, lw, lstop)
	go b.loop()
	return b, nil
}

// open starts a watch of v's bucket. stop ends it, and the goroutine
// nats.go keeps for the watch's context with it.
func (b *Balancer[O]) open(v *view) (kw jetstream.KeyWatcher, stop func(), err error) {
	ctx, cancel := context.WithCancel(b.ctx)
	kw, err = v.kv.WatchAll(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return kw, func() { _ = kw.Stop(); cancel() }, nil
}

// openAtStart opens v's watch for Start, trying again while the
// server says no for a passing reason (a cluster electing its meta
// leader answers "JetStream system temporarily unavailable"), with a
// doubling pause, until ctx (Start's) ends; a permanent refusal (a
// permissions violation) ends it at once. Before, Start failed on the
// first refusal: TestNoJobRunsTwiceWithALaggingFollower's new worker,
// started on a node right after another node's crash, failed so in CI.
func (b *Balancer[O]) openAtStart(ctx context.Context, v *view) (jetstream.KeyWatcher, func(), error) {
	pause := 50 * time.Millisecond
	for {
		kw, stop, err := b.open(v)
		if err == nil || natserr.IsPermanent(err) {
			return kw, stop, err
		}
		b.cfg.Log.Warn("watch at start failed; trying again", "bucket", v.kv.Bucket(), "err", err)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, errors.Join(err, ctx.Err())
		}
		pause = min(2*pause, time.Second)
	}
}

// follow applies v's watch kw until Stop, and watches again whenever the
// watch's channel closes: after a jittered backoff that doubles from
// TTL/20 up to TTL while watches keep failing or closing early, and starts
// over once one lived a TTL.
func (b *Balancer[O]) follow(v *view, kw jetstream.KeyWatcher, stop func()) {
	defer b.wg.Done()
	ttl := b.cfg.Lease.TTL
	bucket := v.kv.Bucket()
	var backoff time.Duration
	for {
		opened := time.Now()
		b.drain(v, kw)
		stop()
		if b.ctx.Err() != nil {
			return
		}
		b.mu.Lock()
		v.synced = false
		b.mu.Unlock()
		if time.Since(opened) >= ttl {
			backoff = 0
		}
		backoff = nextBackoff(backoff, ttl)
		b.cfg.Log.Warn("bucket watch closed; watching it again", "bucket", bucket, "retry_in", backoff)
		for {
			t := time.NewTimer(backoff)
			select {
			case <-b.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			var err error
			kw, stop, err = b.open(v)
			if err == nil {
				break
			}
			backoff = nextBackoff(backoff, ttl)
			b.cfg.Log.Warn("watch bucket", "bucket", bucket, "err", err, "retry_in", backoff)
		}
		// The new watch replays the bucket: forget what the old one said,
		// including deletes and expiries it never delivered.
		b.mu.Lock()
		v.reset()
		b.mu.Unlock()
		b.cfg.Log.Info("watching bucket again", "bucket", bucket)
	}
}

// drain applies kw's entries to v until its channel closes or the
// balancer stops.
func (b *Balancer[O]) drain(v *view, kw jetstream.KeyWatcher) {
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
				v.synced = true
			} else {
				v.apply(e)
			}
			b.mu.Unlock()
			b.poke()
		}
	}
}

// forgetLeases marks every partition free as of now, with no stuck marks.
// It runs with b.mu held.
func (b *Balancer[O]) forgetLeases() {
	now := time.Now()
	for p := range b.holders {
		b.holders[p] = holder{free: true, since: now}
	}
	clear(b.stuck)
}

// onMember and onLease run with b.mu held.
func (b *Balancer[O]) onMember(e jetstream.KeyValueEntry) {
	if e.Operation() == jetstream.KeyValuePut {
		b.members[e.Key()] = true
		b.memberSeen[e.Key()] = time.Now()
	} else {
		delete(b.members, e.Key())
		delete(b.memberSeen, e.Key())
	}
}

func (b *Balancer[O]) onLease(e jetstream.KeyValueEntry) {
	if p, id, ok := parseStuckKey(e.Key()); ok {
		if e.Operation() == jetstream.KeyValuePut {
			if b.stuck[p] == nil {
				b.stuck[p] = map[string]bool{}
			}
			b.stuck[p][id] = true
		} else if b.stuck[p] != nil {
			delete(b.stuck[p], id)
			if len(b.stuck[p]) == 0 {
				delete(b.stuck, p)
			}
		}
		return
	}
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
		b.cfg.Log.Warn("undecodable lease entry", "partition", p, "err", err)
		return
	}
	b.holders[p] = holder{id: info.Holder, seen: time.Now()}
}

func (b *Balancer[O]) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

func (b *Balancer[O]) loop() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.Lease.TTL / 3)
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
func (b *Balancer[O]) reregister() {
	b.mu.Lock()
	stopping := b.stopping
	b.mu.Unlock()
	if stopping {
		return
	}
	b.cfg.Log.Warn("member entry lost; registering again", "err", b.member.Err())
	ctx, cancel := context.WithTimeout(b.ctx, 2*b.cfg.Lease.TTL)
	defer cancel()
	m, err := lease.Campaign(ctx, b.cfg.Members, b.cfg.ID, b.cfg.Lease)
	if err != nil {
		b.cfg.Log.Error("register member again", "err", err)
		return
	}
	b.mu.Lock()
	b.member = m
	b.mu.Unlock()
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
