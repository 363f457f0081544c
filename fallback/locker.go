package fallback

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Locker hands out locks kept in one Redis deployment. It is safe for
// concurrent use. Close stops every watchdog it started and its shared
// pub/sub subscription.
type Locker struct {
	c *core
}

// New returns a Locker over client. A nil cfg means the zero Config. If
// client is a *redis.Client or *redis.ClusterClient with retries on, New
// opens a clone with retries off for the mutating scripts; Close closes it.
// The caller keeps ownership of client.
func New(client Client, cfg *Config) (*Locker, error) {
	if client == nil {
		return nil, errors.New("fallback: nil Client")
	}
	c, err := newCore([]Client{client}, cfg)
	if err != nil {
		return nil, err
	}
	return &Locker{c: c}, nil
}

// Close abandons every lock still held through l (their watchdogs stop,
// Done closes with ErrClosed, Redis drops them after their TTL), closes the
// shared subscription, and waits for every goroutine l started.
func (l *Locker) Close() error { return l.c.close() }

// Mutex returns the exclusive lock named key. Many Mutex values for one key
// (in one process or many) exclude each other. With WithOwner the lock is
// reentrant for that owner. Do not use one key both as Mutex and RWMutex.
func (l *Locker) Mutex(key string) *Mutex {
	return &Mutex{c: l.c, name: key, k: l.c.cfg.keys(key)}
}

// FairMutex returns the exclusive lock named key whose waiters acquire it in
// arrival order. Plain and fair locks on one key do not mix.
func (l *Locker) FairMutex(key string) *Mutex {
	m := l.Mutex(key)
	m.fair = true
	return m
}

// Do locks the Mutex named key, runs fn with a context that is cancelled if
// the lock ends (and with the fence of this acquisition), and unlocks.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	return l.Mutex(key).Do(ctx, fn, opts...)
}

// Mutex is an exclusive lock in Redis. Its zero value is not usable; get one
// from Locker.Mutex, Locker.FairMutex or RedLock.Mutex. It is safe for
// concurrent use; each Lock call is a separate acquisition.
type Mutex struct {
	c    *core
	name string
	k    keys
	fair bool
	red  *RedLock
}

// Lock blocks until the lock is acquired or ctx ends. In the second case
// the error wraps ErrNotAcquired and ctx.Err().
func (m *Mutex) Lock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.lock(ctx, true, opts)
}

// TryLock makes one attempt and returns an error wrapping ErrNotAcquired if
// the lock is held.
func (m *Mutex) TryLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return m.lock(ctx, false, opts)
}

// Do acquires the lock (blocking), runs fn with a context that dies with
// the lock and with the fence, then unlocks. It returns fn's error joined
// with the reason the lock ended early, if it did.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	l, err := m.Lock(ctx, opts...)
	if err != nil {
		return err
	}
	return l.do(ctx, fn)
}

func (m *Mutex) lock(ctx context.Context, block bool, opts []Option) (*Lock, error) {
	o, err := m.c.cfg.options(opts)
	if err != nil {
		return nil, err
	}
	if m.red != nil {
		return m.red.lock(ctx, m, block, o)
	}
	n := m.c.nodes[0]
	ttlMS := strconv.FormatInt(o.ttl.Milliseconds(), 10)
	w := waitSpec{channel: m.k.channel, wakeAll: m.fair}

	var try attemptFunc
	var ops lockOps
	// undo releases an acquisition whose reply was lost. It is safe only
	// when the owner is unique to this call.
	var undo func(ctx context.Context)
	switch {
	case m.fair:
		owner, unique := o.owner, o.owner == ""
		if unique {
			owner = newToken()
		}
		waitMS := strconv.FormatInt(m.c.cfg.FairWaitTimeout.Milliseconds(), 10)
		w.maxWait = m.c.cfg.FairWaitTimeout / 3
		w.leave = func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, m.c.cfg.FairWaitTimeout)
			defer cancel()
			_, _ = fairCancelScript.run(ctx, n.scripts, []string{m.k.queue, m.k.timeouts}, owner, m.k.channel)
		}
		try = func(ctx context.Context, enqueue bool) (attemptResult, error) {
			flag := "0"
			if enqueue {
				flag = "1"
			}
			return m.attempt(ctx, fairAcquireScript, n, []string{m.k.lock, m.k.queue, m.k.timeouts, m.k.fence}, owner, ttlMS, waitMS, flag)
		}
		ops = m.hashOps(n, owner, ttlMS)
		if unique {
			undo = func(ctx context.Context) { _, _ = ops.release(ctx) }
		}
	case o.owner != "":
		try = func(ctx context.Context, _ bool) (attemptResult, error) {
			return m.attempt(ctx, reentrantAcquireScript, n, []string{m.k.lock, m.k.fence}, o.owner, ttlMS)
		}
		ops = m.hashOps(n, o.owner, ttlMS)
	default:
		token := newToken()
		try = func(ctx context.Context, _ bool) (attemptResult, error) {
			return m.attempt(ctx, acquireScript, n, []string{m.k.lock, m.k.fence}, token, ttlMS)
		}
		ops = tokenOps(n, m.k.lock, token, m.k.channel, ttlMS)
		undo = func(ctx context.Context) { _, _ = ops.release(ctx) }
	}

	r, err := m.c.acquire(ctx, block, w, try)
	if err != nil {
		// A plain "held by someone else" needs no undo; anything else may
		// have left an acquisition behind whose reply we never saw.
		if undo != nil && err != ErrNotAcquired && !errors.Is(err, ErrClosed) && !nothingRan(err) {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ttl)
			undo(uctx)
			cancel()
		}
		return nil, err
	}
	return m.c.track(ctx, m.name, r, o, ops)
}

func (m *Mutex) attempt(ctx context.Context, s *script, n *node, keys []string, args ...any) (attemptResult, error) {
	sent := time.Now()
	v, err := s.run(ctx, n.scripts, keys, args...)
	if errors.Is(err, ErrRefused) {
		// Refused: nothing to wait for (Lock undoes what a script refused
		// part-way may have written).
		return attemptResult{}, fmt.Errorf("%w: %q: %w", ErrNotAcquired, m.name, err)
	}
	if err != nil {
		return attemptResult{}, &transportError{fmt.Errorf("%w: %q: %w", ErrNotAcquired, m.name, err)}
	}
	ok, num, err := acquireReply(v)
	if err != nil {
		return attemptResult{}, err
	}
	if ok {
		return attemptResult{ok: true, fence: uint64(num), sent: sent}, nil
	}
	return attemptResult{retryIn: time.Duration(num) * time.Millisecond}, nil
}

func (m *Mutex) hashOps(n *node, owner, ttlMS string) lockOps {
	return lockOps{
		renew: func(ctx context.Context) (bool, error) {
			v, err := reentrantRenewScript.run(ctx, n.scripts, []string{m.k.lock}, owner, ttlMS)
			return v == int64(1), err
		},
		release: func(ctx context.Context) (bool, error) {
			v, err := reentrantReleaseScript.run(ctx, n.scripts, []string{m.k.lock}, owner, m.k.channel)
			if err != nil {
				return false, err
			}
			left, _ := v.(int64)
			return left >= 0, nil
		},
	}
}

func tokenOps(n *node, key, token, channel, ttlMS string) lockOps {
	return lockOps{
		renew: func(ctx context.Context) (bool, error) {
			v, err := renewScript.run(ctx, n.scripts, []string{key}, token, ttlMS)
			return v == int64(1), err
		},
		release: func(ctx context.Context) (bool, error) {
			v, err := releaseScript.run(ctx, n.scripts, []string{key}, token, channel)
			return v == int64(1), err
		},
	}
}

// transportError marks an error after which the script may or may not have
// run.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

func isTransport(err error) bool {
	var te *transportError
	return errors.As(err, &te)
}
