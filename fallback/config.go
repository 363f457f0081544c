package fallback

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config configures a Locker or a RedLock. The zero value is ready to use;
// a nil *Config means the zero value.
type Config struct {
	// TTL is how long a lock lives in Redis between renewals when the
	// watchdog keeps it (no WithLeaseTime). The watchdog renews every TTL/3.
	// Defaults to 30 s.
	TTL time.Duration

	// ClockDriftFactor sizes the safety margin taken off every trust window:
	// margin = TTL*ClockDriftFactor + 2 ms, as in the Redlock description.
	// Defaults to 0.01.
	ClockDriftFactor float64

	// MinBackoff is the first wait between attempts of a blocked Lock when no
	// release notification arrives; it doubles up to MaxBackoff.
	// Defaults to 10 ms.
	MinBackoff time.Duration

	// MaxBackoff caps the wait between attempts of a blocked Lock. It is
	// the safety net under the pub/sub notification, not the normal path.
	// Defaults to 500 ms.
	MaxBackoff time.Duration

	// FairWaitTimeout is how long a waiter of a fair lock keeps its place in
	// the queue without polling. A waiter whose process died blocks the
	// queue at most this long. Live waiters poll at least every third of it.
	// Defaults to 5 s.
	FairWaitTimeout time.Duration

	// NodeTimeout bounds each per-node call of a RedLock acquisition; it
	// must be small against TTL so a dead node costs little validity.
	// Defaults to 50 ms.
	NodeTimeout time.Duration

	// KeyPrefix is put before every key name. Keys of one lock share the
	// hash tag {name}, so they live in one Redis Cluster slot.
	// Defaults to "keylane:lock:".
	KeyPrefix string

	// Logger receives renewal failures and lost locks.
	// Defaults to a logger that discards everything.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.TTL == 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.ClockDriftFactor == 0 {
		cfg.ClockDriftFactor = 0.01
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 10 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 500 * time.Millisecond
	}
	if cfg.FairWaitTimeout == 0 {
		cfg.FairWaitTimeout = 5 * time.Second
	}
	if cfg.NodeTimeout == 0 {
		cfg.NodeTimeout = 50 * time.Millisecond
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "keylane:lock:"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validTTL(cfg.TTL); err != nil {
		return cfg, err
	}
	switch {
	case cfg.ClockDriftFactor < 0 || cfg.ClockDriftFactor >= 0.5:
		return cfg, errors.New("fallback: ClockDriftFactor must be in [0, 0.5)")
	case cfg.MinBackoff < 0 || cfg.MaxBackoff < cfg.MinBackoff:
		return cfg, errors.New("fallback: need 0 <= MinBackoff <= MaxBackoff")
	case cfg.FairWaitTimeout < 10*time.Millisecond:
		return cfg, errors.New("fallback: FairWaitTimeout must be at least 10ms")
	case cfg.NodeTimeout < 0:
		return cfg, errors.New("fallback: NodeTimeout must be positive")
	}
	return cfg, nil
}

func validTTL(d time.Duration) error {
	if d < 10*time.Millisecond {
		return fmt.Errorf("fallback: TTL %v is below 10ms", d)
	}
	return nil
}

// margin is the part of a trust window given up to clock drift and to the
// time between Redis applying a command and the client seeing the reply.
func (c *Config) margin(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*c.ClockDriftFactor) + 2*time.Millisecond
}

// Option sets a per-call knob of Lock, TryLock, RLock, TryRLock and Do.
type Option func(*lockOptions)

type lockOptions struct {
	ttl   time.Duration
	lease time.Duration
	owner string
}

// WithTTL sets the watchdog TTL of this acquisition, overriding Config.TTL.
func WithTTL(d time.Duration) Option {
	return func(o *lockOptions) { o.ttl = d }
}

// WithLeaseTime gives the lock a fixed lease of d and turns the watchdog
// off: nothing renews it, Done closes when the lease (less the safety
// margin) runs out, and Redis drops the key after d.
func WithLeaseTime(d time.Duration) Option {
	return func(o *lockOptions) { o.lease = d }
}

// WithOwner makes the acquisition reentrant for owner: the same owner may
// acquire again while holding, and the lock is free only when every
// acquisition has been unlocked. Go has no thread identity, so the caller
// names the owner (a job ID, a request ID). Not supported by RedLock or
// RWMutex.
func WithOwner(owner string) Option {
	return func(o *lockOptions) { o.owner = owner }
}

func (c *Config) options(opts []Option) (lockOptions, error) {
	o := lockOptions{ttl: c.TTL}
	for _, opt := range opts {
		opt(&o)
	}
	if o.lease != 0 {
		if err := validTTL(o.lease); err != nil {
			return o, err
		}
		o.ttl = o.lease
	}
	if err := validTTL(o.ttl); err != nil {
		return o, err
	}
	return o, nil
}
