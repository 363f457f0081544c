package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketConfig describes a KV bucket that holds leases.
type BucketConfig struct {
	// Name of the bucket. Required.
	Name string
	// TTL is the lease TTL, used as the bucket's MaxAge: an entry that is
	// not rewritten within TTL is removed by the server. Required (> 0).
	TTL time.Duration
	// Replicas of the bucket's stream. Defaults to 1.
	Replicas int
}

// EnsureBucket creates the lease bucket described by cfg, or opens it if it
// already exists. The bucket keeps one value per key (History 1), expires
// entries TTL after their last write (MaxAge), is stored on file, and leaves
// a limit marker when it expires an entry, so watchers see the expiry as a
// KeyValuePurge operation.
//
// An existing bucket whose TTL or history differs from the one asked for,
// or that has no limit markers, is an error wrapping ErrBucketMismatch that
// names both values. Other settings of an existing bucket (replicas,
// storage) are kept as they are. EnsureBucket is idempotent and safe to call
// from several processes at once.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (jetstream.KeyValue, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: BucketConfig.Name is required", ErrInvalidConfig)
	}
	if cfg.TTL <= 0 {
		return nil, fmt.Errorf("%w: BucketConfig.TTL must be > 0, got %s", ErrInvalidConfig, cfg.TTL)
	}
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("%w: BucketConfig.Replicas must be >= 0, got %d", ErrInvalidConfig, cfg.Replicas)
	}
	replicas := cfg.Replicas
	if replicas == 0 {
		replicas = 1
	}
	kvCfg := jetstream.KeyValueConfig{
		Bucket:         cfg.Name,
		TTL:            cfg.TTL,
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
		LimitMarkerTTL: markerTTL(cfg.TTL),
	}
	kv, err := js.CreateKeyValue(ctx, kvCfg)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return nil, fmt.Errorf("lease: create bucket %q: %w", cfg.Name, err)
	}
	// It exists with some other configuration: find out whether the
	// difference matters to the protocol.
	kv, err = js.KeyValue(ctx, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("lease: open bucket %q: %w", cfg.Name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: status of bucket %q: %w", cfg.Name, err)
	}
	if st.TTL() != cfg.TTL || st.History() != 1 || st.LimitMarkerTTL() <= 0 {
		return nil, fmt.Errorf("%w: bucket %q exists with TTL %s, history %d, limit marker TTL %s; asked for TTL %s, history 1, limit marker TTL %s",
			ErrBucketMismatch, cfg.Name, st.TTL(), st.History(), st.LimitMarkerTTL(), cfg.TTL, kvCfg.LimitMarkerTTL)
	}
	return kv, nil
}

// markerTTL is how long the server keeps the marker it leaves when it
// expires an entry. The server counts it in whole seconds, at least one.
// Markers only need to live long enough to be delivered to watchers that
// are connected; Create works on a key whose last message is a marker.
func markerTTL(ttl time.Duration) time.Duration {
	d := ttl.Truncate(time.Second)
	if d < ttl {
		d += time.Second
	}
	return max(d, time.Second)
}
