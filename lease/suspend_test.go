package lease

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// suspendableClock is the boot clock plus the time a test says the system
// spent suspended. suspend makes it jump the way CLOCK_BOOTTIME does over a
// real suspend, while Go's monotonic clock (CLOCK_MONOTONIC) stays put.
type suspendableClock struct{ suspended atomic.Int64 }

func (c *suspendableClock) now() time.Duration {
	return bootClock() + time.Duration(c.suspended.Load())
}

func (c *suspendableClock) suspend(d time.Duration) { c.suspended.Add(int64(d)) }

// suspendingKV runs hook after each renew (Update) lands, before its reply
// is returned to the watchdog.
type suspendingKV struct {
	jetstream.KeyValue
	hook func()
}

func (k *suspendingKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	newRev, err := k.KeyValue.Update(ctx, key, value, rev)
	k.hook()
	return newRev, err
}

func suspendBucket(t *testing.T, ttl time.Duration) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := EnsureBucket(t.Context(), js, BucketConfig{Name: "LEASES", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// acquireOnClock takes key with the trust window kept on clk, and releases
// the lease when the test ends.
func acquireOnClock(t *testing.T, kv jetstream.KeyValue, key string, clk clock) *Lease {
	t.Helper()
	cfg, err := Config{Holder: "holder"}.resolve(t.Context(), kv)
	if err != nil {
		t.Fatal(err)
	}
	l, err := acquireOn(t.Context(), kv, key, cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
	return l
}

func isDone(l *Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// A host suspended (laptop lid, VM suspend-to-RAM) for longer than the TTL
// resumes with Go's monotonic clock where it stopped, but the lease's
// entry expired on the server meanwhile. The trust window is measured on
// the boot clock, which counts the suspended time, so the holder distrusts
// its lease on the first check, the watchdog ends it, and a renew whose
// reply comes back after the suspend is not counted.
func TestSuspendedHostDistrustsExpiredLease(t *testing.T) {
	const ttl = time.Second
	const suspendedFor = 2 * ttl

	t.Run("first check after resume", func(t *testing.T) {
		clk := &suspendableClock{}
		l := acquireOnClock(t, suspendBucket(t, ttl), "p.0", clk.now)
		start := time.Now()
		if !l.Trusted() {
			t.Fatalf("not trusted right after acquire: %v", l.Err())
		}
		clk.suspend(suspendedFor)
		trusted, err := l.Trusted(), l.Err()
		if monotonic := time.Since(start); monotonic >= l.cfg.window() {
			t.Fatalf("the check took %s of monotonic time, past the window: the test proves nothing", monotonic)
		}
		if trusted || !errors.Is(err, ErrExpired) || !isDone(l) {
			t.Fatalf("after a %s suspend (%s on the monotonic clock): trusted=%v, err=%v, done=%v; want untrusted, ErrExpired, done",
				suspendedFor, time.Since(start), trusted, err, isDone(l))
		}
		t.Logf("after the suspend: %v", err)
	})

	t.Run("watchdog after resume", func(t *testing.T) {
		clk := &suspendableClock{}
		l := acquireOnClock(t, suspendBucket(t, ttl), "p.0", clk.now)
		clk.suspend(suspendedFor)
		// Nothing calls Trusted or Err: the watchdog wakes within one
		// RenewEvery and must see the window closed on the boot clock.
		testwait.Eventually(t, 2*l.cfg.RenewEvery+200*time.Millisecond, "the watchdog ends the lease", func() bool { return isDone(l) })
		if err := l.Err(); !errors.Is(err, ErrExpired) {
			t.Fatalf("err = %v, want ErrExpired", err)
		}
	})

	t.Run("renew reply after resume", func(t *testing.T) {
		clk := &suspendableClock{}
		var once atomic.Bool
		kv := &suspendingKV{KeyValue: suspendBucket(t, ttl)}
		kv.hook = func() {
			if once.CompareAndSwap(false, true) {
				clk.suspend(suspendedFor) // suspended while the renew was in flight
			}
		}
		l := acquireOnClock(t, kv, "p.0", clk.now)
		testwait.Eventually(t, 2*l.cfg.RenewEvery+200*time.Millisecond, "the watchdog ends the lease", func() bool { return isDone(l) })
		if err := l.Err(); !errors.Is(err, ErrExpired) || !strings.Contains(err.Error(), "after the trust deadline") {
			t.Fatalf("err = %v, want ErrExpired for a reply after the trust deadline", err)
		}
	})
}
