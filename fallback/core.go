package fallback

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// core is what Locker and RedLock share: config, nodes, and the set of live
// locks so Close can stop their watchdogs.
type core struct {
	cfg   Config
	nodes []*node

	mu     sync.Mutex
	locks  map[*Lock]struct{}
	closed bool
}

func newCore(clients []Client, cfg *Config) (*core, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	co := &core{cfg: c, locks: make(map[*Lock]struct{})}
	for _, cl := range clients {
		n, err := newNode(cl, c.Logger)
		if err != nil {
			_ = co.close()
			return nil, err
		}
		co.nodes = append(co.nodes, n)
	}
	return co, nil
}

func (c *core) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	locks := make([]*Lock, 0, len(c.locks))
	for l := range c.locks {
		locks = append(locks, l)
	}
	c.locks = nil
	c.mu.Unlock()
	for _, l := range locks {
		l.abandon()
	}
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.close())
	}
	return errors.Join(errs...)
}

// track starts a Lock and registers it for Close. If the core is closed it
// releases the acquisition and returns ErrClosed.
func (c *core) track(ctx context.Context, key string, a attemptResult, o lockOptions, ops lockOps) (*Lock, error) {
	l := newLock(key, a.fence, a.sent, o.ttl, c.cfg.margin(o.ttl), o.lease == 0, ops, c.cfg.Logger)
	l.untrack = c.untrack
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.locks[l] = struct{}{}
	}
	c.mu.Unlock()
	if closed {
		l.halt()
		_, _ = ops.release(context.WithoutCancel(ctx))
		l.end(ErrClosed)
		return nil, ErrClosed
	}
	return l, nil
}

func (c *core) untrack(l *Lock) {
	c.mu.Lock()
	delete(c.locks, l)
	c.mu.Unlock()
}

func (c *core) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// attemptResult is the outcome of one acquisition attempt.
type attemptResult struct {
	ok      bool
	fence   uint64
	sent    time.Time     // when the attempt was sent: the trust window starts here
	retryIn time.Duration // when the current holder's lease ends, if known (>0)
	soft    error         // why not acquired, when it is worth reporting (RedLock)
}

// attemptFunc makes one attempt. enqueue tells a fair lock whether to keep
// a place in the queue. A returned error ends the wait.
type attemptFunc func(ctx context.Context, enqueue bool) (attemptResult, error)

// waitSpec says how to wait for a key.
type waitSpec struct {
	channel string
	wakeAll bool
	maxWait time.Duration             // cap on one wait, 0 for MaxBackoff
	leave   func(ctx context.Context) // called when a blocked wait gives up (fair queue)
}

// acquire makes one attempt, and if block is set keeps attempting until it
// succeeds or ctx ends. Between attempts it waits for a release
// notification, for the holder's lease to end, or for a jittered
// exponential backoff (MinBackoff doubling to MaxBackoff), whichever is
// first; there is no fixed-interval spinning.
func (c *core) acquire(ctx context.Context, block bool, w waitSpec, try attemptFunc) (attemptResult, error) {
	if c.isClosed() {
		return attemptResult{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return attemptResult{}, errors.Join(ErrNotAcquired, err)
	}
	r, err := try(ctx, block)
	if err != nil || r.ok {
		return r, err
	}
	if !block {
		return r, notAcquired(r.soft)
	}

	wake := make(chan struct{}, 1)
	var readies []<-chan struct{}
	for _, n := range c.nodes {
		wt, ready, err := n.notify.register(ctx, w.channel, w.wakeAll, wake)
		if err != nil {
			continue
		}
		defer n.notify.unregister(wt)
		readies = append(readies, ready)
	}
	// Wait (briefly) for the subscriptions to be active, so a release
	// between the first attempt and now is caught by the next attempt and
	// later ones by the notification.
	readyTimer := time.NewTimer(20 * c.cfg.MinBackoff)
	for _, ready := range readies {
		select {
		case <-ready:
		case <-readyTimer.C:
		case <-ctx.Done():
		}
	}
	readyTimer.Stop()

	maxWait := c.cfg.MaxBackoff
	if w.maxWait > 0 && w.maxWait < maxWait {
		maxWait = w.maxWait
	}
	backoff := c.cfg.MinBackoff
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return r, c.giveUp(ctx, w, r, err)
		}
		r, err = try(ctx, true)
		if err != nil {
			if ctx.Err() != nil {
				return r, c.giveUp(ctx, w, r, ctx.Err())
			}
			if w.leave != nil {
				w.leave(context.WithoutCancel(ctx))
			}
			return r, err
		}
		if r.ok {
			return r, nil
		}
		d := min(backoff, maxWait)
		d = d/2 + rand.N(d/2+1) // jitter in [d/2, d]
		if r.retryIn > 0 && r.retryIn < d {
			d = r.retryIn
		}
		backoff = min(2*backoff, maxWait)
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-timer.C:
		}
	}
}

func (c *core) giveUp(ctx context.Context, w waitSpec, r attemptResult, cause error) error {
	if w.leave != nil {
		w.leave(context.WithoutCancel(ctx))
	}
	if r.soft != nil {
		return errors.Join(ErrNotAcquired, r.soft, cause)
	}
	return errors.Join(ErrNotAcquired, cause)
}

func notAcquired(soft error) error {
	if soft != nil {
		if errors.Is(soft, ErrNotAcquired) {
			return soft
		}
		return errors.Join(ErrNotAcquired, soft)
	}
	return ErrNotAcquired
}
