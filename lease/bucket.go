package lease

import (
	"context"
	"errors"
	"fmt"
	"regexp"
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
// A bucket it creates starts its revisions (and so its fences) at the
// wall-clock time in microseconds since the Unix epoch, not at 1, so the
// fences of a bucket that was deleted and made again stay above those of
// the one before (see "Fencing" in the package documentation).
//
// An existing bucket whose TTL or history differs from the one asked for,
// or that has no limit markers, is an error wrapping ErrBucketMismatch that
// names both values. Other settings of an existing bucket (replicas,
// storage, first revision) are kept as they are. EnsureBucket is idempotent
// and safe to call from several processes at once.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (jetstream.KeyValue, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: BucketConfig.Name is required", ErrInvalidConfig)
	}
	if !validBucketName.MatchString(cfg.Name) {
		return nil, fmt.Errorf("%w: BucketConfig.Name %q: %w", ErrInvalidConfig, cfg.Name, jetstream.ErrInvalidBucketName)
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
	// Limit markers need a server that knows message TTLs (2.11, API level
	// 1); an older one would ignore the setting and make a bucket without
	// them. nats.go's CreateKeyValue makes the same check.
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: create bucket %q: %w", cfg.Name, err)
	}
	if info.API.Level < 1 {
		return nil, fmt.Errorf("lease: create bucket %q: %w", cfg.Name, jetstream.ErrLimitMarkerTTLNotSupported)
	}
	scfg := bucketStream(cfg.Name, cfg.TTL, replicas, firstRevision(time.Now()))
	_, err = js.CreateStream(ctx, scfg)
	// Another creator (or an earlier run) made it first: with another
	// FirstSeq, so the server says the name is in use. Open it and check
	// the settings that matter.
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("lease: create bucket %q: %w", cfg.Name, err)
	}
	kv, err := js.KeyValue(ctx, cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("lease: open bucket %q: %w", cfg.Name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: status of bucket %q: %w", cfg.Name, err)
	}
	if st.TTL() != cfg.TTL || st.History() != 1 || st.LimitMarkerTTL() <= 0 {
		return nil, fmt.Errorf("%w: bucket %q exists with TTL %s, history %d, limit marker TTL %s; asked for TTL %s, history 1, limit marker TTL %s",
			ErrBucketMismatch, cfg.Name, st.TTL(), st.History(), st.LimitMarkerTTL(), cfg.TTL, scfg.SubjectDeleteMarkerTTL)
	}
	return kv, nil
}

// validBucketName is nats.go's rule for bucket names.
var validBucketName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// bucketStream is the stream nats.go's CreateKeyValue would make for
// KeyValueConfig{Bucket: name, TTL: ttl, History: 1, Storage: FileStorage,
// Replicas: replicas, LimitMarkerTTL: markerTTL(ttl)} (prepareKeyValueConfig
// in nats.go's jetstream/kv.go), plus FirstSeq, which KeyValueConfig cannot
// set. js.KeyValue opens it as a bucket like any other.
func bucketStream(name string, ttl time.Duration, replicas int, firstSeq uint64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                   "KV_" + name,
		Subjects:               []string{"$KV." + name + ".>"},
		MaxMsgsPerSubject:      1, // History
		MaxBytes:               -1,
		MaxAge:                 ttl,
		MaxMsgSize:             -1,
		Storage:                jetstream.FileStorage,
		Replicas:               replicas,
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             min(ttl, 2*time.Minute),
		MaxMsgs:                -1,
		MaxConsumers:           -1,
		AllowDirect:            true,
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            true,
		SubjectDeleteMarkerTTL: markerTTL(ttl),
		FirstSeq:               firstSeq,
	}
}

// firstRevision is the first revision of a bucket created at now: the wall
// clock in microseconds since the Unix epoch. A bucket takes far fewer
// than one write per microsecond, so its revisions stay below the time of
// any later creation, and a bucket made again after a delete starts above
// every revision of the one before, unless the wall clock went back by
// more than the time between the old bucket's last write and the new
// bucket's creation. It stays below 2^53 until the year 2255, so fences
// survive a trip through a float64 (JSON, Lua).
func firstRevision(now time.Time) uint64 {
	return uint64(max(now.UnixMicro(), 1))
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
