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
//
// Times here are readings of l.clock, which counts suspended time. Go's
// timers and context deadlines run on the monotonic clock, which does not:
// after a suspend they fire late. So every wake-up and every reply is
// checked against l.clock, and a timer only decides when to look again.
func (l *Lease) watchdog(ctx context.Context, sent time.Duration) {
	defer close(l.watchdogDone)
	var (
		// unknownSince is the send time of the first renew, since the last
		// one known to have landed, whose outcome we do not know (valid if
		// unknown). Every such renew expected the same revision, so at
		// most one of them landed, and it was sent no earlier than this.
		unknownSince time.Duration
		unknown      bool
		lastErr      error
		backoff      time.Duration
		next         = sent + l.cfg.RenewEvery
	)
	timer := time.NewTimer(next - l.clock())
	defer timer.Stop()
	for {
		deadline := l.trustDeadline()
		now := l.clock()
		if now >= deadline {
			l.expire(lastErr)
			return
		}
		if now < next {
			timer.Reset(min(next-now, deadline-now))
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
		send := l.clock()
		// Bound the attempt by the deadline (a reply after it could not
		// extend the window anyway) and by one period, so that a request
		// lost in a reconnect is retried while there is time.
		actx, cancel := context.WithTimeout(ctx, min(l.cfg.RenewEvery, deadline-send))
		newRev, err := l.kv.Update(actx, l.key, l.value, rev)
		cancel()
		if err == nil {
			l.revision.Store(newRev)
		}
		if ctx.Err() != nil {
			return // stopped by Release or Orphan
		}
		if l.cfg.Renewed != nil {
			l.cfg.Renewed(l.clock()-send, err)
		}
		switch {
		case err == nil:
			if l.clock() >= deadline {
				// The write may have reached the server after it had
				// expired the previous entry, in which case the expiry
				// marker (a rollup) can erase it: never trust it.
				l.expire(errors.New("renew reply arrived after the trust deadline"))
				return
			}
			unknown, lastErr, backoff = false, nil, 0
			l.setDeadline(send)
			next = send + l.cfg.RenewEvery
			l.logger.Debug("lease renewed", slog.Uint64("revision", newRev), slog.Duration("rtt", l.clock()-send))

		case isConflict(err) && !unknown:
			// Every earlier write is accounted for, so the entry changed
			// under us: someone else wrote, deleted or took the key.
			l.lose(rev, err)
			return

		case isConflict(err):
			// An earlier renew with an unknown outcome may be what moved
			// the revision. Read the entry: only this tenure writes its
			// nonce.
			gctx, cancel := context.WithTimeout(ctx, deadline-l.clock())
			cur, ours, gerr := l.lookup(gctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			// The read may come from a replica that has not applied the
			// newest entry (a KV get is a direct get, answered by any
			// current-enough replica): only a revision past rev, which
			// the conflict proves moved, can be our unknown renew; ours
			// at rev or before is a stale read, and stays unknown.
			switch {
			case gerr == nil && ours && cur <= rev:
				backoff = nextBackoff(backoff, l.cfg.RenewEvery/4)
				next = l.clock() + backoff
			case gerr == nil && ours && l.clock() < deadline:
				l.revision.Store(cur)
				// It was sent no earlier than unknownSince: start the
				// window there.
				l.setDeadline(unknownSince)
				next = unknownSince + l.cfg.RenewEvery
				unknown, lastErr, backoff = false, nil, 0
				l.logger.Info("lease renew outcome resolved: an earlier attempt landed", slog.Uint64("revision", cur))
			case gerr == nil && !ours:
				l.lose(rev, err)
				return
			default:
				if gerr != nil {
					lastErr = gerr
				}
				backoff = nextBackoff(backoff, l.cfg.RenewEvery/4)
				next = l.clock() + backoff
			}

		default:
			// Timeout, disconnect, no responders: unknown, never lost.
			if !unknown {
				unknownSince, unknown = send, true
			}
			lastErr = err
			backoff = nextBackoff(backoff, l.cfg.RenewEvery/4)
			next = l.clock() + backoff
			l.logger.Warn("lease renew failed, outcome unknown; retrying",
				slog.Uint64("revision", rev), slog.Any("err", err), slog.Duration("trusted_for", deadline-l.clock()))
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
	lastSent := l.trustDeadline() - l.cfg.window()
	since := (l.clock() - lastSent).Round(time.Millisecond)
	msg := fmt.Sprintf("no renew of %q landed within %s of the last one, sent %s ago", l.key, l.cfg.window(), since)
	attrs := []any{slog.Uint64("revision", l.revision.Load()), slog.Duration("window", l.cfg.window()), slog.Duration("since_last_renew", since)}
	if cause != nil {
		msg += fmt.Sprintf(" (%v)", cause)
		attrs = append(attrs, slog.Any("err", cause))
	}
	if l.end(fmt.Errorf("%w: %s", ErrExpired, msg)) {
		l.logger.Warn("lease expired", append([]any{slog.String("reason", msg)}, attrs...)...)
	}
}

// nextBackoff doubles prev, starting at 25ms, up to limit.
func nextBackoff(prev, limit time.Duration) time.Duration {
	return max(min(2*prev, limit), min(25*time.Millisecond, limit))
}
