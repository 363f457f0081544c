package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go/jetstream"
)

// Lease is one tenure of a key: from the Create that took it to the moment
// it is lost, expires, is released or is orphaned. While it lives, a
// watchdog goroutine renews it every Config.RenewEvery. A Lease is safe for
// concurrent use; its zero value is not usable (get one from Acquire or
// Campaign).
type Lease struct {
	kv     jetstream.KeyValue
	key    string
	nonce  string
	value  []byte
	fence  uint64
	cfg    Config
	logger *slog.Logger

	// clock is the clock of the trust window (bootClock, which counts
	// suspended time); deadline is the reading of it at which the window
	// closes, so Trusted is a clock read and an atomic load.
	clock    clock
	deadline atomic.Int64
	revision atomic.Uint64

	// life ends, with err as its cause, when the lease does; done is its
	// Done channel.
	mu      sync.Mutex // guards err and the ending of life
	err     error
	life    context.Context
	endLife context.CancelCauseFunc
	done    <-chan struct{}

	stopWatchdog context.CancelFunc
	watchdogDone chan struct{}

	releaseMu     sync.Mutex
	released      bool  // Release reached a definite outcome
	releaseErr    error // that outcome, returned again by later calls
	deleteUnknown bool  // an earlier Release sent a delete whose outcome is unknown
}

// Acquire makes one attempt to take key: it creates the entry, and on
// success starts the watchdog and returns the lease. If the key is taken it
// returns a *HeldError, which wraps ErrHeld. It blocks for a few round trips
// (the bucket status, the Create) and never waits for the key.
func Acquire(ctx context.Context, kv jetstream.KeyValue, key string, cfg Config) (*Lease, error) {
	kv = natserr.KeyValue(kv) // errors say "nats:" once
	cfg, err := cfg.resolve(ctx, kv)
	if err != nil {
		return nil, err
	}
	return acquire(ctx, kv, key, cfg)
}

// acquire is Acquire with a resolved Config.
func acquire(ctx context.Context, kv jetstream.KeyValue, key string, cfg Config) (*Lease, error) {
	return acquireOn(ctx, kv, key, cfg, bootClock)
}

// acquireOn is acquire with the trust window kept on clk.
func acquireOn(ctx context.Context, kv jetstream.KeyValue, key string, cfg Config, clk clock) (*Lease, error) {
	info := Info{Holder: cfg.Holder, Nonce: newNonce(), AcquiredAt: time.Now().UTC(), Host: cfg.Host, Version: cfg.Version}
	value, err := info.encode()
	if err != nil {
		return nil, err
	}
	// The window starts when the Create is sent: the server stamps the
	// entry later than this, so it expires later than our window closes.
	sent := clk()
	rev, err := kv.Create(ctx, key, value)
	if err != nil {
		if isConflict(err) {
			return nil, heldBy(ctx, kv, key)
		}
		// A timeout is not a "no": the Create may have landed.
		rev, err = resolveCreate(ctx, kv, key, info.Nonce, cfg, err)
		if err != nil {
			return nil, err
		}
	}
	if elapsed := clk() - sent; elapsed >= cfg.window() {
		// The window this Create opened closed before we heard back.
		// Give the entry back instead of holding a lease we cannot trust.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.RenewEvery)
		_ = kv.Delete(dctx, key, jetstream.LastRevision(rev))
		cancel()
		return nil, fmt.Errorf("%w: create of %q took %s, longer than the trust window %s", ErrExpired, key, elapsed, cfg.window())
	}
	// Renews write the fence too, so a reader of the entry (keylane status)
	// learns the tenure's fence rather than the latest renew's revision.
	info.Fence = rev
	if value, err = info.encode(); err != nil {
		return nil, err
	}
	return start(kv, key, cfg, info.Nonce, value, rev, sent, clk), nil
}

// heldBy reads the current holder of key for the error Acquire returns.
func heldBy(ctx context.Context, kv jetstream.KeyValue, key string) error {
	info, rev, err := Read(ctx, kv, key)
	if err != nil {
		return &HeldError{Key: key}
	}
	return &HeldError{Key: key, Holder: info.Holder, Revision: rev}
}

// resolveCreate settles a Create whose outcome is unknown by reading the
// key back. If our entry is there and the caller still wants the lease, the
// Create won; if the caller gave up meanwhile, the entry is deleted again.
func resolveCreate(ctx context.Context, kv jetstream.KeyValue, key, nonce string, cfg Config, cause error) (uint64, error) {
	failed := fmt.Errorf("lease: acquire %q: %w", key, cause)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.RenewEvery)
	defer cancel()
	e, err := kv.Get(rctx, key)
	if err != nil {
		return 0, failed
	}
	info, err := Decode(e.Value())
	if err != nil || info.Nonce != nonce {
		return 0, failed
	}
	if ctx.Err() != nil {
		_ = kv.Delete(rctx, key, jetstream.LastRevision(e.Revision()))
		return 0, failed
	}
	return e.Revision(), nil
}

// start builds the lease for a Create that landed at rev and starts its
// watchdog.
func start(kv jetstream.KeyValue, key string, cfg Config, nonce string, value []byte, rev uint64, sent time.Duration, clk clock) *Lease {
	wctx, cancel := context.WithCancel(context.Background())
	life, endLife := context.WithCancelCause(context.Background())
	l := &Lease{
		kv:           kv,
		key:          key,
		nonce:        nonce,
		value:        value,
		fence:        rev,
		cfg:          cfg,
		logger:       cfg.Logger.With(slog.String("lease", key), slog.String("holder", cfg.Holder), slog.Uint64("fence", rev)),
		clock:        clk,
		life:         life,
		endLife:      endLife,
		done:         life.Done(),
		stopWatchdog: cancel,
		watchdogDone: make(chan struct{}),
	}
	l.revision.Store(rev)
	l.setDeadline(sent)
	l.logger.Debug("lease acquired", slog.Duration("ttl", cfg.TTL), slog.Time("trusted_until", l.TrustDeadline()))
	go l.watchdog(wctx, sent)
	return l
}

// Key returns the lease's key.
func (l *Lease) Key() string { return l.key }

// Holder returns Config.Holder of the lease.
func (l *Lease) Holder() string { return l.cfg.Holder }

// Fence returns the revision of the Create that started this tenure. It is
// a stream sequence, so it is strictly greater than the fence of every
// earlier tenure of any key in the bucket, and, for buckets that
// EnsureBucket created, of every tenure in an earlier bucket of the same
// name that was deleted since (their revisions start at the creation time
// in microseconds). Renews do not change it: pass it with every write that
// the lease protects and have the store refuse a fence lower than the
// highest it has seen.
func (l *Lease) Fence() uint64 { return l.fence }

// Revision returns the revision of the entry's latest write by this lease
// (the Create or a renew). Release deletes at this revision.
func (l *Lease) Revision() uint64 { return l.revision.Load() }

// Done returns a channel that is closed when the lease ends: lost, expired,
// released or orphaned. A timer closes it at the trust deadline; Trusted
// and Err close it as soon as they see the deadline passed. After that
// nothing renews the lease again.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Context returns a context derived from parent that is cancelled when
// parent is, or soon after the lease ends (as Done closes: lost, expired,
// released or orphaned); context.Cause then reports why, for the lease the
// same error as Err. Hand it to the work the lease protects, so that work
// stops when the lease can no longer be trusted; it does not replace
// checking Trusted before acting (see "Pauses and suspends" in the package
// documentation). If the lease has already ended, the context is cancelled
// on return. Call cancel when done with the context: it releases what ties
// the context to the lease, and does not end the lease. It starts no
// goroutine that outlives the context.
func (l *Lease) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	cctx, cancelCause := context.WithCancelCause(parent)
	stop := context.AfterFunc(l.life, func() { cancelCause(context.Cause(l.life)) })
	if l.life.Err() != nil {
		// Ended already: say so now rather than when AfterFunc's goroutine runs.
		stop()
		cancelCause(context.Cause(l.life))
	}
	return cctx, func() {
		stop()
		cancelCause(context.Canceled)
	}
}

// Err returns nil while the lease lives, and after Done is closed an error
// wrapping ErrLost, ErrExpired or ErrReleased (ErrOrphaned after Orphan)
// that says why it ended. Like Trusted, it reads the clock: past the trust
// deadline it ends the lease with ErrExpired itself rather than wait for
// the watchdog.
func (l *Lease) Err() error {
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	if err == nil && !l.inWindow() {
		l.expire(errors.New("noticed by Err"))
		return l.Err()
	}
	return err
}

// Trusted reports whether the lease may still be acted on: it has not
// ended and its trust window has not closed. The window is measured on a
// clock that counts time the system spent suspended (CLOCK_BOOTTIME on
// Linux). Trusted reads that clock itself, so a process resumed after a
// long pause or a suspend sees false at once, before the watchdog had a
// chance to run; in that case it also ends the lease with ErrExpired
// (closing Done). It costs a clock read (a system call on Linux) and a few
// atomic loads: call it before every acknowledgement.
func (l *Lease) Trusted() bool {
	select {
	case <-l.done:
		return false
	default:
	}
	if !l.inWindow() {
		l.expire(errors.New("noticed by Trusted"))
		return false
	}
	return true
}

// inWindow reports whether the lease's clock is before the trust deadline.
func (l *Lease) inWindow() bool {
	return l.clock() < l.trustDeadline()
}

// TrustDeadline returns the end of the trust window: the send time of the
// last write known to have landed, plus TTL minus SafetyMargin. The window
// is kept on a clock that counts suspended time; TrustDeadline maps its end
// onto time.Now's clock as of the call, and carries a monotonic clock
// reading, so compare it with time.Now, not with a time that came from
// elsewhere. A suspend after the call brings the real end earlier than the
// returned time (Go's monotonic clock stops during a suspend): ask Trusted
// before acting, not the time.
func (l *Lease) TrustDeadline() time.Time {
	return time.Now().Add(l.trustDeadline() - l.clock())
}

// trustDeadline is the reading of l.clock at which the window closes.
func (l *Lease) trustDeadline() time.Duration {
	return time.Duration(l.deadline.Load())
}

// setDeadline opens a window for a write sent at the reading sent of
// l.clock.
func (l *Lease) setDeadline(sent time.Duration) {
	l.deadline.Store(int64(sent + l.cfg.window()))
}

// end finishes the lease with err unless it already ended, and reports
// whether this call ended it.
func (l *Lease) end(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	l.err = err
	l.endLife(err)
	return true
}

// halt stops the watchdog and waits for its goroutine to return.
func (l *Lease) halt() {
	l.stopWatchdog()
	<-l.watchdogDone
}

// Release ends the lease and deletes its entry at the last revision, so a
// contender watching the key takes it at once. Done is closed (and Trusted
// false) before the delete is sent. It waits for the watchdog goroutine to
// return. If the entry is no longer ours (the lease was lost, or expired
// and someone took the key) it returns an error wrapping ErrLost; any
// other error leaves the outcome unknown, and a later call tries again.
// Once it reached an outcome, later calls return the same result.
func (l *Lease) Release(ctx context.Context) error {
	l.halt()
	l.releaseMu.Lock()
	defer l.releaseMu.Unlock()
	if l.released {
		return l.releaseErr
	}
	l.end(fmt.Errorf("%w: key %q", ErrReleased, l.key))
	if err := l.Err(); errors.Is(err, ErrLost) {
		return l.settleRelease(fmt.Errorf("lease: release %q: %w", l.key, err))
	}
	rev := l.revision.Load()
	err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if isConflict(err) {
		// A renew cut short by the stop (or an earlier unknown delete) may
		// have landed. Only this tenure writes its nonce, so read it back.
		cur, ours, gerr := l.lookupPast(ctx, rev)
		switch {
		case gerr != nil:
			return fmt.Errorf("lease: release %q: %w", l.key, gerr)
		case !ours && l.deleteUnknown:
			// Our earlier delete landed, or the entry expired: gone either way.
			rev, err = cur, nil
		case !ours:
			return l.settleRelease(fmt.Errorf("%w: release of %q at revision %d: %w", ErrLost, l.key, rev, err))
		default:
			rev = cur
			l.revision.Store(cur)
			err = l.kv.Delete(ctx, l.key, jetstream.LastRevision(cur))
			if isConflict(err) {
				return l.settleRelease(fmt.Errorf("%w: release of %q at revision %d: %w", ErrLost, l.key, cur, err))
			}
		}
	}
	if err != nil {
		l.deleteUnknown = true
		l.logger.Warn("lease release failed; the entry expires by TTL unless a retry succeeds", slog.Any("err", err))
		return fmt.Errorf("lease: release %q: %w", l.key, err)
	}
	l.logger.Debug("lease released", slog.Uint64("revision", rev))
	return l.settleRelease(nil)
}

func (l *Lease) settleRelease(err error) error {
	l.released, l.releaseErr = true, err
	return err
}

// Orphan stops renewing the lease and waits for the watchdog goroutine to
// return, without deleting the entry: the server expires it one TTL after
// its last write, as if the process had crashed. Done is closed and Err
// wraps ErrOrphaned. Release may still be called afterwards to delete it.
func (l *Lease) Orphan() {
	l.halt()
	if l.end(ErrOrphaned) {
		l.logger.Info("lease orphaned", slog.Uint64("revision", l.revision.Load()))
	}
}

// lookupPast reads the entry after a write expecting revision rev
// conflicted, so the entry is known to have moved past rev. A read of our
// entry at rev or before comes from a replica that has not applied the
// newer write (any replica answers a KV get): it reads again, with a short
// backoff, until it sees past rev or ctx ends; then the error says the
// replicas stayed behind, and the outcome is unknown, not lost.
func (l *Lease) lookupPast(ctx context.Context, rev uint64) (cur uint64, ours bool, err error) {
	var backoff time.Duration
	for {
		cur, ours, err = l.lookup(ctx)
		if err != nil || !ours || cur > rev {
			return cur, ours, err
		}
		backoff = nextBackoff(backoff, 100*time.Millisecond)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, false, fmt.Errorf("read revision %d, not past %d, after a conflict, until %w: the replicas stayed behind", cur, rev, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// lookup reads the entry and reports its revision and whether it carries
// this tenure's nonce. A free key is not ours and not an error.
func (l *Lease) lookup(ctx context.Context) (rev uint64, ours bool, err error) {
	e, err := l.kv.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	info, err := Decode(e.Value())
	if err != nil {
		return e.Revision(), false, nil
	}
	return e.Revision(), info.Nonce == l.nonce, nil
}
