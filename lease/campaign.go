package lease

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go/jetstream"
)

// Campaign blocks until it takes key or ctx ends. It watches the key and
// tries Acquire at the start, whenever it sees the key deleted, purged or
// expired (the server's limit marker), and, as a safety net against a
// missed event, once every TTL. Errors that may pass (a disconnect, a
// server restart) are retried with backoff; a Config that cannot work is
// returned at once. When ctx ends first it returns
// errors.Join(ErrNotAcquired, ctx.Err()).
func Campaign(ctx context.Context, kv jetstream.KeyValue, key string, cfg Config) (*Lease, error) {
	kv = natserr.KeyValue(kv) // errors say "nats:" once
	c := campaign{kv: kv, key: key}
	defer c.stopWatch()

	resolved, err := c.resolve(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c.cfg = resolved
	logger := resolved.Logger.With(slog.String("lease", key), slog.String("holder", resolved.Holder))

	timer := time.NewTimer(0)
	defer timer.Stop()
	var backoff time.Duration
	for {
		wait := resolved.TTL
		// Watch before trying, so a delete right after a failed Create is
		// still seen.
		if err := c.watch(ctx); err != nil {
			backoff = nextBackoff(backoff, resolved.TTL)
			wait = backoff
			logger.Warn("lease watch failed; retrying", slog.Any("err", err))
		} else {
			l, err := acquire(ctx, kv, key, resolved)
			if err == nil {
				return l, nil
			}
			if ctx.Err() != nil {
				return nil, errors.Join(ErrNotAcquired, ctx.Err())
			}
			if held := (*HeldError)(nil); errors.As(err, &held) {
				backoff = 0
				logger.Debug("lease held; waiting for it to be free", slog.String("current_holder", held.Holder), slog.Uint64("revision", held.Revision))
			} else {
				backoff = nextBackoff(backoff, resolved.TTL)
				wait = backoff
				logger.Warn("lease acquire failed; retrying", slog.Any("err", err), slog.Duration("backoff", backoff))
			}
		}
		if err := c.waitFree(ctx, timer, wait); err != nil {
			return nil, errors.Join(ErrNotAcquired, err)
		}
	}
}

// campaign is the state of one Campaign call.
type campaign struct {
	kv  jetstream.KeyValue
	key string
	cfg Config
	w   jetstream.KeyWatcher
}

// resolve checks cfg, retrying errors that may pass.
func (c *campaign) resolve(ctx context.Context, cfg Config) (Config, error) {
	var backoff time.Duration
	for {
		resolved, err := cfg.resolve(ctx, c.kv)
		switch {
		case err == nil:
			return resolved, nil
		case ctx.Err() != nil:
			return cfg, errors.Join(ErrNotAcquired, ctx.Err())
		case errors.Is(err, ErrInvalidConfig), errors.Is(err, ErrBucketMismatch):
			return cfg, err
		}
		backoff = nextBackoff(backoff, time.Second)
		select {
		case <-ctx.Done():
			return cfg, errors.Join(ErrNotAcquired, ctx.Err())
		case <-time.After(backoff):
		}
	}
}

// watch starts the watcher unless it runs.
func (c *campaign) watch(ctx context.Context) error {
	if c.w != nil {
		return nil
	}
	w, err := c.kv.Watch(ctx, c.key, jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return err
	}
	c.w = w
	return nil
}

func (c *campaign) stopWatch() {
	if c.w != nil {
		_ = c.w.Stop()
		c.w = nil
	}
}

// waitFree returns when the watcher reports the key deleted, purged or
// expired, or after wait, or with ctx's error when ctx ends.
func (c *campaign) waitFree(ctx context.Context, timer *time.Timer, wait time.Duration) error {
	timer.Reset(wait)
	var updates <-chan jetstream.KeyValueEntry
	if c.w != nil {
		updates = c.w.Updates()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case e, ok := <-updates:
			if !ok {
				// The subscription closed (the connection did): start over.
				c.stopWatch()
				return nil
			}
			if e == nil {
				continue
			}
			if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
				timer.Stop()
				return nil
			}
		}
	}
}
