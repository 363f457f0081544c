package lease

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultTTL is the lease TTL suggested for lease buckets.
const DefaultTTL = 10 * time.Second

// Config says who takes a lease and how it is kept.
type Config struct {
	// Holder names who holds the lease (a worker ID); it is stored in the
	// entry for others to read. Required.
	Holder string
	// Host and Version are written into the entry (Info) for humans to
	// read: where the holder runs and what build it is. Optional; the
	// protocol never reads them.
	Host, Version string
	// TTL is the lease TTL. It must equal the bucket's TTL (its MaxAge):
	// Acquire and Campaign read the bucket's status and refuse a mismatch
	// with an error wrapping ErrBucketMismatch. Defaults to the bucket's
	// TTL (DefaultTTL is the suggested value for buckets).
	TTL time.Duration
	// RenewEvery is the period of renewals. Must be > 0 and < TTL.
	// Defaults to TTL/3.
	RenewEvery time.Duration
	// SafetyMargin is subtracted from the trust window to cover clock rate
	// drift and the server's expiry slop. Must be < TTL - RenewEvery.
	// Defaults to TTL/10.
	SafetyMargin time.Duration
	// Logger receives the lease's events at Debug, Info and Warn. Defaults
	// to a logger that discards.
	Logger *slog.Logger
	// Renewed, if set, is called by the watchdog after every renew attempt
	// with its round trip (on the trust window's clock) and its error: nil
	// if the renew landed. It runs on the watchdog goroutine and must not
	// block. It is meant for metrics. Defaults to nil.
	Renewed func(took time.Duration, err error)
}

// resolve checks c against the bucket that kv is a view of and fills in the
// defaults. It costs one round trip (the bucket status).
func (c Config) resolve(ctx context.Context, kv jetstream.KeyValue) (Config, error) {
	if c.Holder == "" {
		return c, fmt.Errorf("%w: Config.Holder is required", ErrInvalidConfig)
	}
	if c.TTL < 0 || c.RenewEvery < 0 || c.SafetyMargin < 0 {
		return c, fmt.Errorf("%w: negative duration (TTL %s, RenewEvery %s, SafetyMargin %s)", ErrInvalidConfig, c.TTL, c.RenewEvery, c.SafetyMargin)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return c, fmt.Errorf("lease: status of bucket %q: %w", kv.Bucket(), err)
	}
	bucketTTL := st.TTL()
	if bucketTTL <= 0 {
		return c, fmt.Errorf("%w: bucket %q has no TTL, its entries would never expire", ErrBucketMismatch, kv.Bucket())
	}
	if c.TTL == 0 {
		c.TTL = bucketTTL
	}
	if c.TTL != bucketTTL {
		return c, fmt.Errorf("%w: Config.TTL is %s but bucket %q has TTL %s", ErrBucketMismatch, c.TTL, kv.Bucket(), bucketTTL)
	}
	return c.withDefaults()
}

// withDefaults fills in the defaults that depend on TTL alone and checks
// that the durations leave room for a renew inside the trust window.
func (c Config) withDefaults() (Config, error) {
	if c.TTL <= 0 {
		return c, fmt.Errorf("%w: Config.TTL must be > 0, got %s", ErrInvalidConfig, c.TTL)
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = c.TTL / 10
	}
	if c.RenewEvery <= 0 || c.RenewEvery >= c.TTL {
		return c, fmt.Errorf("%w: Config.RenewEvery must be > 0 and < TTL (%s), got %s", ErrInvalidConfig, c.TTL, c.RenewEvery)
	}
	if c.SafetyMargin >= c.TTL-c.RenewEvery {
		return c, fmt.Errorf("%w: Config.SafetyMargin %s must be < TTL - RenewEvery (%s - %s = %s), or the window closes before the next renew",
			ErrInvalidConfig, c.SafetyMargin, c.TTL, c.RenewEvery, c.TTL-c.RenewEvery)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// window is how long a successful write is trusted after it was sent.
func (c Config) window() time.Duration { return c.TTL - c.SafetyMargin }
