package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// watchdog renews the lease until it is stopped or the lease ends. It is
// the only writer of the lease's revision and deadline while it runs.
func (l *Lease) watchdog(ctx context.Context, sent time.Time) {
	defer close(l.watchdogDone)
	var (
		// unknownSince is the send time of the first renew, since the last
		// one known to have landed, whose outcome we do not know (zero if
		// none). Every such renew expected the same revision, so at most
		// one of them landed, and it was sent no earlier than this.
		unknownSince time.Time
		lastErr      error
		backoff      time.Duration
		next         = sent.Add(l.cfg.RenewEvery)
	)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		deadline := l.TrustDeadline()
		now := time.Now()
		if !now.Before(deadline) {
			l.expire(lastErr)
			return
		}
		if now.Before(next) {
			timer.Reset(min(next.Sub(now), deadline.Sub(now)))
			select {
			case <-ctx.Done():
				return
			case <-l.done: // ended by Trusted or Err
				return
			case <-timer.C:
			}
			continue
		}
		select {
		case <-l.done:
			return
		default:
		}

		rev := l.revision.Load()
		send := time.Now()
		// Bound the attempt by the deadline (a reply after it could not
		// extend the window anyway) and by one period, so that a request
		// lost in a reconnect is retried while there is time.
		attemptEnd := send.Add(l.cfg.RenewEvery)
		if deadline.Before(attemptEnd) {
			attemptEnd = deadline
		}
		actx, cancel := context.WithDeadline(ctx, attemptEnd)
		newRev, err := l.kv.Update(actx, l.key, l.value, rev)
		cancel()
		if err == nil {
			l.revision.Store(newRev)
		}
		if ctx.Err() != nil {
			return // stopped by Release or Orphan
		}
		switch {
		case err == nil:
			if !time.Now().Before(deadline) {
				// The write may have reached the server after it had
				// expired the previous entry, in which case the expiry
				// marker (a rollup) can erase it: never trust it.
				l.expire(errors.New("renew reply arrived after the trust deadline"))
				return
			}
			unknownSince, lastErr, backoff = time.Time{}, nil, 0
			l.setDeadline(send)
			next = send.Add(l.cfg.RenewEvery)
			l.logger.Debug("lease renewed", slog.Uint64("revision", newRev), slog.Duration("rtt", time.Since(send)))

		case isConflict(err) && unknownSince.IsZero():
			// Every earlier write is accounted for, so the entry changed
			// under us: someone else wrote, deleted or took the key.
			l.lose(rev, err)
			return

		case isConflict(err):
			// An earlier renew with an unknown outcome may be what moved
			// the revision. Read the entry: only this tenure writes its
			// nonce.
			gctx, cancel := context.WithDeadline(ctx, deadline)
			cur, ours, gerr := l.lookup(gctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			switch {
			case gerr == nil && ours && time.Now().Before(deadline):
				l.revision.Store(cur)
				// It was sent no earlier than unknownSince: start the
				// window there.
				l.setDeadline(unknownSince)
				next = unknownSince.Add(l.cfg.RenewEvery)
				unknownSince, lastErr, backoff = time.Time{}, nil, 0
				l.logger.Info("lease renew outcome resolved: an earlier attempt landed", slog.Uint64("revision", cur))
			case gerr == nil && !ours:
				l.lose(rev, err)
				return
			default:
				if gerr != nil {
					lastErr = gerr
				}
				backoff = nextBackoff(backoff, l.cfg.RenewEvery/4)
				next = time.Now().Add(backoff)
			}

		default:
			// Timeout, disconnect, no responders: unknown, never lost.
			if unknownSince.IsZero() {
				unknownSince = send
			}
			lastErr = err
			backoff = nextBackoff(backoff, l.cfg.RenewEvery/4)
			next = time.Now().Add(backoff)
			l.logger.Warn("lease renew failed, outcome unknown; retrying",
				slog.Uint64("revision", rev), slog.Any("err", err), slog.Duration("trusted_for", time.Until(deadline)))
		}
	}
}

func (l *Lease) lose(rev uint64, cause error) {
	err := fmt.Errorf("%w: renew of %q at revision %d: %w", ErrLost, l.key, rev, cause)
	if l.end(err) {
		l.logger.Warn("lease lost", slog.Uint64("revision", rev), slog.Any("err", cause))
	}
}

func (l *Lease) expire(cause error) {
	lastSent := l.TrustDeadline().Add(-l.cfg.window())
	msg := fmt.Sprintf("no renew of %q landed within %s of the last one, sent %s ago", l.key, l.cfg.window(), time.Since(lastSent).Round(time.Millisecond))
	if cause != nil {
		msg += fmt.Sprintf(" (%v)", cause)
	}
	if l.end(fmt.Errorf("%w: %s", ErrExpired, msg)) {
		l.logger.Warn("lease expired", slog.Uint64("revision", l.revision.Load()), slog.Any("err", cause))
	}
}

// nextBackoff doubles prev, starting at 25ms, up to limit.
func nextBackoff(prev, limit time.Duration) time.Duration {
	return max(min(2*prev, limit), min(25*time.Millisecond, limit))
}
