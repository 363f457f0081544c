package fallback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// lockOps renews and releases one acquisition. held is false when Redis
// says the acquisition is no longer there.
type lockOps struct {
	renew   func(ctx context.Context) (held bool, err error)
	release func(ctx context.Context) (held bool, err error)
}

// Lock is one acquisition of a lock. It is safe for concurrent use.
//
// A Lock shows its own life: Done is closed and Err says why once the lock
// is unlocked, lost, or no longer trustworthy. While the watchdog runs (no
// WithLeaseTime) it renews the lock every TTL/3; the holder trusts the lock
// only until sendTimeOfLastSuccessfulRenew + TTL − margin, on the monotonic
// clock, and Done closes when that passes without a newer renewal.
type Lock struct {
	key      string
	fence    uint64
	ttl      time.Duration
	margin   time.Duration
	watchdog bool
	ops      lockOps
	log      *slog.Logger
	untrack  func(*Lock)

	life context.Context
	end  context.CancelCauseFunc
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu         sync.Mutex
	validUntil time.Time
	unlocked   bool
}

func newLock(key string, fence uint64, sent time.Time, ttl, margin time.Duration, watchdog bool, ops lockOps, log *slog.Logger) *Lock {
	l := &Lock{
		key: key, fence: fence, ttl: ttl, margin: margin, watchdog: watchdog,
		ops: ops, log: log.With("key", key, "fence", fence),
		validUntil: sent.Add(ttl - margin),
	}
	l.life, l.end = context.WithCancelCause(context.Background())
	var stopCtx context.Context
	stopCtx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.run(stopCtx)
	return l
}

// Key returns the lock's name.
func (l *Lock) Key() string { return l.key }

// Fence returns the fencing token of this acquisition: a number that is
// strictly greater than that of every earlier acquisition of the same key.
// Pass it to the protected resource and have the resource refuse any number
// not greater than the last one it accepted. A reentrant re-entry returns
// the fence of the hold it joins.
func (l *Lock) Fence() uint64 { return l.fence }

// Done returns a channel closed when the lock ends: unlocked, lost, expired,
// or abandoned by Close.
func (l *Lock) Done() <-chan struct{} { return l.life.Done() }

// Err returns nil while the lock is trusted, and after Done is closed the
// reason: ErrUnlocked, ErrLost, ErrExpired or ErrClosed.
func (l *Lock) Err() error {
	if l.life.Err() == nil {
		return nil
	}
	return context.Cause(l.life)
}

// ValidUntil returns the end of the current trust window (monotonic).
func (l *Lock) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Context returns a context that is cancelled when parent is, or when the
// lock ends; context.Cause then reports why (ErrLost, ErrExpired, …). Hand it
// to the critical section. Call cancel when done with it.
func (l *Lock) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(l.life, func() { cancel(context.Cause(l.life)) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// Unlock stops the watchdog, then releases the lock in Redis if this
// acquisition still holds it. It returns an error wrapping ErrNotHeld when it
// does not (expired, taken over, or already unlocked); in that case nothing
// is deleted. No renewal is sent after Unlock starts.
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.unlocked {
		l.mu.Unlock()
		return fmt.Errorf("%w: %q already unlocked", ErrNotHeld, l.key)
	}
	l.unlocked = true
	l.mu.Unlock()

	l.halt()
	if l.untrack != nil {
		l.untrack(l)
	}
	cause := l.Err()
	held, err := l.ops.release(ctx)
	l.end(ErrUnlocked)
	switch {
	case err != nil:
		return fmt.Errorf("fallback: unlock %q: %w", l.key, err)
	case !held && cause != nil:
		return fmt.Errorf("%w: Redis holds %q under another token or none; nothing deleted (this acquisition ended earlier: %w)", ErrNotHeld, l.key, cause)
	case !held:
		return fmt.Errorf("%w: Redis holds %q under another token or none; nothing deleted", ErrNotHeld, l.key)
	}
	return nil
}

// halt stops the watchdog and waits for it.
func (l *Lock) halt() {
	l.stop()
	l.wg.Wait()
}

// abandon ends the lock without releasing it (Close); Redis drops it after
// its TTL.
func (l *Lock) abandon() {
	l.halt()
	l.end(ErrClosed)
}

func (l *Lock) lose(cause error) {
	l.log.Warn("fallback: lock ended", "error", cause)
	l.end(cause)
}

func (l *Lock) run(stopCtx context.Context) {
	defer l.wg.Done()
	expiry := time.NewTimer(time.Until(l.ValidUntil()))
	defer expiry.Stop()
	var renewC <-chan time.Time
	var renew *time.Timer
	if l.watchdog {
		renew = time.NewTimer(l.ttl / 3)
		defer renew.Stop()
		renewC = renew.C
	}
	for {
		select {
		case <-stopCtx.Done():
			return
		case <-expiry.C:
			l.lose(ErrExpired)
			return
		case <-renewC:
			sent := time.Now()
			deadline := l.ValidUntil()
			ctx, cancel := context.WithDeadline(stopCtx, deadline)
			held, err := l.ops.renew(ctx)
			cancel()
			if stopCtx.Err() != nil {
				return
			}
			switch {
			case err != nil:
				// Transient: try again soon; the expiry timer ends the
				// lock if no renewal lands inside the trust window.
				l.log.Debug("fallback: renew failed", "error", err)
				renew.Reset(l.ttl / 10)
			case !held:
				l.lose(ErrLost)
				return
			case !time.Now().Before(deadline):
				// Renewed in Redis, but the reply came after we had stopped
				// trusting the lock: too late to count.
				l.lose(fmt.Errorf("%w: renewal came %v too late", ErrExpired, time.Since(deadline)))
				return
			default:
				valid := sent.Add(l.ttl - l.margin)
				l.mu.Lock()
				l.validUntil = valid
				l.mu.Unlock()
				expiry.Reset(time.Until(valid))
				renew.Reset(l.ttl / 3)
			}
		}
	}
}

// do runs fn under the lock with a context that dies with it, then unlocks
// on a context that outlives ctx's cancellation.
func (l *Lock) do(ctx context.Context, fn func(ctx context.Context, fence uint64) error) error {
	cctx, cancel := l.Context(ctx)
	err := fn(cctx, l.fence)
	cancel()
	if cause := l.Err(); cause != nil {
		err = errors.Join(err, cause)
	}
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
	defer ucancel()
	if uerr := l.Unlock(uctx); uerr != nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrExpired) {
		err = errors.Join(err, uerr)
	}
	return err
}
