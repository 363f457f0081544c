package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// The context from Context ends with the lease, however the lease ends,
// and context.Cause says why: the holder's work stops within the same
// bound in which Done closes.
func TestContextEndsWithTheLease(t *testing.T) {
	const ttl = time.Second
	renewEvery := ttl / 3
	cases := []struct {
		name string
		// kv wraps the bucket the lease renews through.
		kv func(jetstream.KeyValue) jetstream.KeyValue
		// end ends the lease behind the holder's back, or by its own hand.
		end func(t *testing.T, kv jetstream.KeyValue, l *lease.Lease)
		// within bounds the wait from end to the context's end.
		within time.Duration
		want   error
	}{
		{
			name: "lost",
			kv:   func(kv jetstream.KeyValue) jetstream.KeyValue { return kv },
			end: func(t *testing.T, kv jetstream.KeyValue, _ *lease.Lease) {
				if err := kv.Delete(t.Context(), "p.0"); err != nil {
					t.Fatal(err)
				}
			},
			// The next renew notices, within one period; the slack covers
			// its round trip and scheduling under -race.
			within: renewEvery + 300*time.Millisecond,
			want:   lease.ErrLost,
		},
		{
			name: "expired",
			// Renews hang until cut off: the trust window closes.
			kv: func(kv jetstream.KeyValue) jetstream.KeyValue {
				return &faultyKV{KeyValue: kv, update: func(ctx context.Context, _ string, _ []byte, _ uint64) (uint64, error) {
					<-ctx.Done()
					return 0, ctx.Err()
				}}
			},
			end:    func(*testing.T, jetstream.KeyValue, *lease.Lease) {},
			within: ttl + 300*time.Millisecond, // the window is TTL minus the margin
			want:   lease.ErrExpired,
		},
		{
			name: "released",
			kv:   func(kv jetstream.KeyValue) jetstream.KeyValue { return kv },
			end: func(t *testing.T, _ jetstream.KeyValue, l *lease.Lease) {
				if err := l.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			},
			within: 100 * time.Millisecond, // Done is closed before Release returns
			want:   lease.ErrReleased,
		},
		{
			name:   "orphaned",
			kv:     func(kv jetstream.KeyValue) jetstream.KeyValue { return kv },
			end:    func(_ *testing.T, _ jetstream.KeyValue, l *lease.Lease) { l.Orphan() },
			within: 100 * time.Millisecond,
			want:   lease.ErrOrphaned,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, ttl)
			l := acquire(t, tc.kv(e.kv), "p.0", config(t, "holder"))
			ctx, cancel := l.Context(t.Context())
			defer cancel()
			if err := ctx.Err(); err != nil {
				t.Fatalf("context of a live lease ended: %v", context.Cause(ctx))
			}

			tc.end(t, e.kv, l)
			start := time.Now()
			testwait.Eventually(t, tc.within, "the lease's context ends", func() bool { return ctx.Err() != nil })
			t.Logf("context ended %s after the lease was %s", time.Since(start).Round(time.Millisecond), tc.name)
			if cause := context.Cause(ctx); !errors.Is(cause, tc.want) || cause != l.Err() {
				t.Fatalf("cause %v, want the lease's error %v (wrapping %v)", cause, l.Err(), tc.want)
			}
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Fatalf("ctx.Err() = %v, want context.Canceled", ctx.Err())
			}
		})
	}
}

// The context ends with its parent or its cancel too, and then leaves the
// lease alone.
func TestContextEndsWithParentOrCancel(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	l := acquire(t, e.kv, "p.0", config(t, "holder"))

	parent, stopParent := context.WithCancelCause(t.Context())
	fromParent, cancel := l.Context(parent)
	defer cancel()
	shutdown := errors.New("shutting down")
	stopParent(shutdown)
	if context.Cause(fromParent) != shutdown {
		t.Fatalf("cause %v, want the parent's %v", context.Cause(fromParent), shutdown)
	}

	cancelled, cancel := l.Context(t.Context())
	cancel()
	if !errors.Is(context.Cause(cancelled), context.Canceled) {
		t.Fatalf("cause after cancel: %v, want context.Canceled", context.Cause(cancelled))
	}
	if !l.Trusted() {
		t.Fatalf("lease ended with its contexts: %v", l.Err())
	}
}

// A context asked of a lease that has already ended is over on return.
func TestContextOfEndedLease(t *testing.T) {
	e := newEnv(t, time.Second)
	l := acquire(t, e.kv, "p.0", config(t, "holder"))
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := l.Context(context.Background())
	defer cancel()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), lease.ErrReleased) {
		t.Fatalf("ctx.Err() %v, cause %v; want it ended with ErrReleased", ctx.Err(), context.Cause(ctx))
	}
}
