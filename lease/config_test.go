package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/lease"
)

func TestEnsureBucket(t *testing.T) {
	e := newEnv(t, 2*time.Second) // creates it once
	ctx := t.Context()

	kv, err := lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: bucketName, TTL: 2 * time.Second})
	if err != nil {
		t.Fatalf("second EnsureBucket: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 2*time.Second || st.History() != 1 || st.LimitMarkerTTL() != 2*time.Second || st.Config().Storage.String() != "File" {
		t.Fatalf("bucket: TTL %s, history %d, marker TTL %s, storage %s", st.TTL(), st.History(), st.LimitMarkerTTL(), st.Config().Storage)
	}

	_, err = lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: bucketName, TTL: 5 * time.Second})
	if !errors.Is(err, lease.ErrBucketMismatch) || !strings.Contains(err.Error(), "2s") || !strings.Contains(err.Error(), "5s") {
		t.Fatalf("EnsureBucket with another TTL: %v; want ErrBucketMismatch naming 2s and 5s", err)
	}

	// A Config whose TTL differs from the bucket's is refused too.
	_, err = lease.Acquire(ctx, e.kv, "p.0", lease.Config{Holder: "a", TTL: 10 * time.Second})
	if !errors.Is(err, lease.ErrBucketMismatch) {
		t.Fatalf("Acquire with TTL 10s on a 2s bucket: %v; want ErrBucketMismatch", err)
	}

	// A sub-second TTL still gets limit markers (the server's minimum is 1s).
	kv, err = lease.EnsureBucket(ctx, e.js, lease.BucketConfig{Name: "SHORT", TTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.LimitMarkerTTL() != time.Second {
		t.Fatalf("marker TTL for a 500ms bucket: %v, %v", st, err)
	}
}

func TestBadConfig(t *testing.T) {
	e := newEnv(t, time.Second)
	ctx := t.Context()

	bucketCases := []struct {
		name string
		cfg  lease.BucketConfig
	}{
		{"no name", lease.BucketConfig{TTL: time.Second}},
		{"no TTL", lease.BucketConfig{Name: "X"}},
		{"negative replicas", lease.BucketConfig{Name: "X", TTL: time.Second, Replicas: -1}},
	}
	for _, tc := range bucketCases {
		t.Run("bucket/"+tc.name, func(t *testing.T) {
			if _, err := lease.EnsureBucket(ctx, e.js, tc.cfg); !errors.Is(err, lease.ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
		})
	}

	cases := []struct {
		name string
		cfg  lease.Config
		want string // in the message
	}{
		{"empty holder", lease.Config{}, "Holder is required"},
		{"negative TTL", lease.Config{Holder: "a", TTL: -time.Second}, "negative"},
		{"renew not below TTL", lease.Config{Holder: "a", RenewEvery: time.Second}, "RenewEvery"},
		{"margin too large", lease.Config{Holder: "a", RenewEvery: 500 * time.Millisecond, SafetyMargin: 600 * time.Millisecond}, "SafetyMargin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lease.Acquire(ctx, e.kv, "p.0", tc.cfg)
			if !errors.Is(err, lease.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Acquire: got %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
			// Campaign refuses it at once rather than retrying.
			_, err = lease.Campaign(ctx, e.kv, "p.0", tc.cfg)
			if !errors.Is(err, lease.ErrInvalidConfig) {
				t.Fatalf("Campaign: got %v, want ErrInvalidConfig", err)
			}
		})
	}

	t.Run("zero durations take defaults", func(t *testing.T) {
		l := acquire(t, e.kv, "p.0", lease.Config{Holder: "a"})
		// TTL defaults to the bucket's (1s), the window to TTL - TTL/10.
		if left := time.Until(l.TrustDeadline()); left <= 0 || left > 900*time.Millisecond {
			t.Fatalf("trust window of a fresh lease: %s left, want (0, 900ms]", left)
		}
	})
}
