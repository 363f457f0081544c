package fallback

import (
	"context"
	"strconv"
)

// RWMutex is a read-write lock in Redis: many readers or one writer. Every
// acquisition, read or write, has its own watchdog and draws a fence from
// the same counter. Readers do not wait for queued writers, so a steady
// stream of overlapping readers can starve a writer. It is safe for
// concurrent use; get one from Locker.RWMutex.
type RWMutex struct {
	m *Mutex
}

// RWMutex returns the read-write lock named key. Do not use one key both as
// Mutex and RWMutex.
func (l *Locker) RWMutex(key string) *RWMutex {
	return &RWMutex{m: l.Mutex(key)}
}

// Lock blocks until the write lock is acquired or ctx ends.
func (rw *RWMutex) Lock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.lock(ctx, true, false, opts)
}

// TryLock makes one attempt at the write lock.
func (rw *RWMutex) TryLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.lock(ctx, false, false, opts)
}

// RLock blocks until a read lock is acquired or ctx ends.
func (rw *RWMutex) RLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.lock(ctx, true, true, opts)
}

// TryRLock makes one attempt at a read lock.
func (rw *RWMutex) TryRLock(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.lock(ctx, false, true, opts)
}

// Do runs fn under the write lock, as Mutex.Do.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	l, err := rw.Lock(ctx, opts...)
	if err != nil {
		return err
	}
	return l.do(ctx, fn)
}

// RDo runs fn under a read lock, as Mutex.Do.
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	l, err := rw.RLock(ctx, opts...)
	if err != nil {
		return err
	}
	return l.do(ctx, fn)
}

func (rw *RWMutex) lock(ctx context.Context, block, read bool, opts []Option) (*Lock, error) {
	m := rw.m
	o, err := m.c.cfg.options(opts)
	if err != nil {
		return nil, err
	}
	if o.owner != "" {
		return nil, errReentrantUnsupported
	}
	n := m.c.nodes[0]
	ttlMS := strconv.FormatInt(o.ttl.Milliseconds(), 10)
	token := newToken()
	keys := []string{m.k.lock, m.k.readers, m.k.fence}
	var try attemptFunc
	var ops lockOps
	if read {
		try = func(ctx context.Context, _ bool) (attemptResult, error) {
			return m.attempt(ctx, readAcquireScript, n, keys, token, ttlMS)
		}
		ops = lockOps{
			renew: func(ctx context.Context) (bool, error) {
				v, err := readRenewScript.run(ctx, n.scripts, []string{m.k.readers}, token, ttlMS)
				return v == int64(1), err
			},
			release: func(ctx context.Context) (bool, error) {
				v, err := readReleaseScript.run(ctx, n.scripts, []string{m.k.readers}, token, m.k.channel)
				return v == int64(1), err
			},
		}
	} else {
		try = func(ctx context.Context, _ bool) (attemptResult, error) {
			return m.attempt(ctx, writeAcquireScript, n, keys, token, ttlMS)
		}
		ops = tokenOps(n, m.k.lock, token, m.k.channel, ttlMS)
	}
	r, err := m.c.acquire(ctx, block, waitSpec{channel: m.k.channel, wakeAll: true}, try)
	if err != nil {
		if err != ErrNotAcquired && !nothingRan(err) {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ttl)
			_, _ = ops.release(uctx)
			cancel()
		}
		return nil, err
	}
	return m.c.track(ctx, m.name, r, o, ops)
}
