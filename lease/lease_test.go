package lease_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnvURL) != "" {
		// The child of TestPausedHolderDistrustsItself is killed, never
		// finishes, and must not check for leaks.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

const bucketName = "LEASES"

// env is one real server with a lease bucket on it.
type env struct {
	srv *server.Server
	js  jetstream.JetStream
	kv  jetstream.KeyValue
}

func newEnv(t *testing.T, ttl time.Duration) env {
	t.Helper()
	s := natstest.Start(t)
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := lease.EnsureBucket(t.Context(), js, lease.BucketConfig{Name: bucketName, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return env{srv: s, js: js, kv: kv}
}

// testLogger logs to the test's output when LEASE_TEST_LOG is set.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if os.Getenv("LEASE_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func config(t *testing.T, holder string) lease.Config {
	return lease.Config{Holder: holder, Logger: testLogger(t)}
}

// acquire takes key or fails the test, and releases the lease when the
// test ends (a no-op if the test released it).
func acquire(t *testing.T, kv jetstream.KeyValue, key string, cfg lease.Config) *lease.Lease {
	t.Helper()
	l, err := lease.Acquire(t.Context(), kv, key, cfg)
	if err != nil {
		t.Fatalf("acquire %q as %q: %v", key, cfg.Holder, err)
	}
	cleanup(t, l)
	return l
}

func cleanup(t *testing.T, l *lease.Lease) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
}

// campaignResult is what a Campaign run in a goroutine returns.
type campaignResult struct {
	l   *lease.Lease
	err error
	at  time.Time // when Campaign returned
}

// campaignAsync runs Campaign in a goroutine that the test waits for.
func campaignAsync(t *testing.T, ctx context.Context, kv jetstream.KeyValue, key string, cfg lease.Config) <-chan campaignResult {
	t.Helper()
	ch := make(chan campaignResult, 1)
	go func() {
		l, err := lease.Campaign(ctx, kv, key, cfg)
		ch <- campaignResult{l: l, err: err, at: time.Now()}
	}()
	return ch
}

func waitResult(t *testing.T, ch <-chan campaignResult, timeout time.Duration) campaignResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("campaign: %v", r.err)
		}
		cleanup(t, r.l)
		return r
	case <-time.After(timeout):
		t.Fatalf("campaign did not return within %s", timeout)
		return campaignResult{}
	}
}

// waitWatching polls until a watcher (an ordered consumer) exists on the
// bucket's stream, so the campaigner will see the next delete.
func waitWatching(t *testing.T, e env) {
	t.Helper()
	testwait.Eventually(t, 5*time.Second, "a campaigner watches the bucket", func() bool {
		s, err := e.js.Stream(t.Context(), "KV_"+bucketName)
		return err == nil && s.CachedInfo().State.Consumers > 0
	})
}

func TestRenewalKeepsLeasePastManyTTLs(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	l := acquire(t, e.kv, "p.0", config(t, "holder"))

	hold := 5 * ttl
	end := time.Now().Add(hold)
	var contenderTries int
	nextTry := time.Now()
	for time.Now().Before(end) {
		if !l.Trusted() {
			t.Fatalf("lease not trusted after %s: err %v", time.Until(end)-hold, l.Err())
		}
		select {
		case <-l.Done():
			t.Fatalf("lease ended: %v", l.Err())
		default:
		}
		if time.Now().After(nextTry) {
			_, err := lease.Acquire(t.Context(), e.kv, "p.0", config(t, "contender"))
			var held *lease.HeldError
			if !errors.As(err, &held) || !errors.Is(err, lease.ErrHeld) || held.Holder != "holder" {
				t.Fatalf("contender's Acquire: got %v, want a HeldError naming holder", err)
			}
			contenderTries++
			nextTry = time.Now().Add(200 * time.Millisecond)
		}
		time.Sleep(10 * time.Millisecond) // sampling period, not a wait for a condition
	}
	if l.Revision() <= l.Fence() {
		t.Fatalf("revision %d not above fence %d after renewals", l.Revision(), l.Fence())
	}
	t.Logf("held %s with TTL %s: fence %d, revision %d, %d contender attempts refused", hold, ttl, l.Fence(), l.Revision(), contenderTries)
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), lease.ErrReleased) || l.Trusted() {
		t.Fatalf("after Release: err %v, trusted %v", l.Err(), l.Trusted())
	}
}

func TestOrphanedLeaseIsTakenOverAfterTTL(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) {
			e := newEnv(t, ttl)
			holder := acquire(t, e.kv, "p.0", config(t, "holder"))
			ch := campaignAsync(t, t.Context(), e.kv, "p.0", config(t, "contender"))
			waitWatching(t, e)

			holder.Orphan()
			if !errors.Is(holder.Err(), lease.ErrOrphaned) || !errors.Is(holder.Err(), lease.ErrReleased) {
				t.Fatalf("orphaned lease err = %v", holder.Err())
			}
			// The server's own timestamp of the last write starts the TTL.
			last, err := e.kv.Get(t.Context(), "p.0")
			if err != nil {
				t.Fatal(err)
			}
			r := waitResult(t, ch, 3*ttl)
			takeover := r.at.Sub(last.Created())
			t.Logf("TTL %s: contender took over %s after the last renew (TTL + %s)", ttl, takeover, takeover-ttl)
			if takeover < ttl {
				t.Fatalf("taken over %s after the last write, before the TTL %s", takeover, ttl)
			}
			if r.at.Before(holder.TrustDeadline()) {
				t.Fatalf("contender acquired before the old holder's trust deadline")
			}
			// DESIGN.md promises take-over within TTL + one renew period
			// (TTL/3). The server removes an expired entry late, never
			// early: its age check compares against a coarse clock (ticks
			// every 100ms, so it lags) and re-checks no sooner than 250ms,
			// so the entry goes up to ~350ms after its TTL (measured:
			// +250ms). The watcher's delivery and the Create add a few ms
			// on an idle machine, and up to half a second on a loaded one
			// under -race (measured: TTL + 470ms and + 530ms in all), so
			// they get a second: the test shows a take-over that waits for
			// the TTL and not for much more, not a latency. With TTL 1s
			// that slop exceeds TTL/3, so the bound is the larger of the
			// two.
			const serverExpirySlop = 350 * time.Millisecond
			const deliveryAndCreate = time.Second
			if bound := ttl + max(ttl/3, serverExpirySlop+deliveryAndCreate); takeover > bound {
				t.Fatalf("take-over took %s, more than %s", takeover, bound)
			}
			if r.l.Fence() <= holder.Fence() {
				t.Fatalf("new fence %d not above old fence %d", r.l.Fence(), holder.Fence())
			}
		})
	}
}

func TestFencesIncreaseAcrossTenures(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	ctx := t.Context()

	first := acquire(t, e.kv, "p.0", config(t, "a"))
	testwait.Eventually(t, 2*ttl, "a renew changes the revision", func() bool { return first.Revision() > first.Fence() })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := acquire(t, e.kv, "p.0", config(t, "b"))
	if second.Fence() <= first.Revision() {
		t.Fatalf("after release: fence %d not above the previous tenure's last revision %d", second.Fence(), first.Revision())
	}

	second.Orphan()
	ch := campaignAsync(t, ctx, e.kv, "p.0", config(t, "c"))
	third := waitResult(t, ch, 3*ttl).l
	if third.Fence() <= second.Revision() {
		t.Fatalf("after expiry: fence %d not above the previous tenure's last revision %d", third.Fence(), second.Revision())
	}

	// A tenure of another key in the same bucket also draws from the
	// stream's sequence.
	other := acquire(t, e.kv, "p.1", config(t, "d"))
	if other.Fence() <= third.Fence() {
		t.Fatalf("fence %d of p.1 not above %d", other.Fence(), third.Fence())
	}
	t.Logf("fences %d, %d, %d, %d", first.Fence(), second.Fence(), third.Fence(), other.Fence())
}

func TestReleaseHandsOverToWatchingCampaigner(t *testing.T) {
	const ttl = 2 * time.Second
	e := newEnv(t, ttl)
	holder := acquire(t, e.kv, "p.0", config(t, "holder"))
	ch := campaignAsync(t, t.Context(), e.kv, "p.0", config(t, "successor"))
	waitWatching(t, e)

	start := time.Now()
	if err := holder.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := waitResult(t, ch, ttl)
	handover := r.at.Sub(start)
	t.Logf("hand-over after Release took %s (TTL %s)", handover, ttl)
	if handover > ttl/4 {
		t.Fatalf("hand-over took %s, want well under the TTL %s", handover, ttl)
	}
	if r.l.Fence() <= holder.Revision() {
		t.Fatalf("successor's fence %d not above %d", r.l.Fence(), holder.Revision())
	}
	// Idempotent.
	if err := holder.Release(t.Context()); err != nil {
		t.Fatalf("second Release: %v", err)
	}
}

func TestLostWhenKeyChangesBehindHoldersBack(t *testing.T) {
	const ttl = time.Second
	cases := []struct {
		name   string
		change func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"delete", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "p.0") }},
		{"purge", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Purge(ctx, "p.0") }},
		{"overwrite", func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "p.0", []byte(`{"holder":"intruder","nonce":"x"}`))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, ttl)
			l := acquire(t, e.kv, "p.0", config(t, "holder"))
			start := time.Now()
			if err := tc.change(t.Context(), e.kv); err != nil {
				t.Fatal(err)
			}
			renewEvery := ttl / 3
			// The next renew notices, within one period; the slack covers
			// its round trip and scheduling under -race.
			testwait.Eventually(t, renewEvery+300*time.Millisecond, "Done closes", func() bool {
				select {
				case <-l.Done():
					return true
				default:
					return false
				}
			})
			t.Logf("%s noticed after %s", tc.name, time.Since(start))
			if !errors.Is(l.Err(), lease.ErrLost) || l.Trusted() {
				t.Fatalf("err %v, trusted %v; want ErrLost, untrusted", l.Err(), l.Trusted())
			}
			if err := l.Release(t.Context()); !errors.Is(err, lease.ErrLost) {
				t.Fatalf("Release of a lost lease: %v, want ErrLost", err)
			}
			if tc.name == "overwrite" {
				if info, _, err := lease.Read(t.Context(), e.kv, "p.0"); err != nil || info.Holder != "intruder" {
					t.Fatalf("Release touched someone else's entry: %+v, %v", info, err)
				}
			}
		})
	}
}

func TestCampaignGivesUpWithContext(t *testing.T) {
	e := newEnv(t, time.Second)
	acquire(t, e.kv, "p.0", config(t, "holder"))
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	l, err := lease.Campaign(ctx, e.kv, "p.0", config(t, "contender"))
	if l != nil || !errors.Is(err, lease.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign = %v, %v; want ErrNotAcquired joined with DeadlineExceeded", l, err)
	}
}

func TestReadAndDecode(t *testing.T) {
	e := newEnv(t, time.Second)
	ctx := t.Context()
	if _, _, err := lease.Read(ctx, e.kv, "p.0"); !errors.Is(err, lease.ErrFree) {
		t.Fatalf("Read of a never-taken key: %v, want ErrFree", err)
	}
	l := acquire(t, e.kv, "p.0", config(t, "worker-7"))
	info, rev, err := lease.Read(ctx, e.kv, "p.0")
	if err != nil || info.Holder != "worker-7" || info.Nonce == "" || info.AcquiredAt.IsZero() || rev < l.Fence() {
		t.Fatalf("Read = %+v, %d, %v", info, rev, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lease.Read(ctx, e.kv, "p.0"); !errors.Is(err, lease.ErrFree) {
		t.Fatalf("Read after release: %v, want ErrFree", err)
	}

	l = acquire(t, e.kv, "p.0", config(t, "worker-8"))
	l.Orphan()
	testwait.Eventually(t, 3*time.Second, "the expired key reads as free", func() bool {
		_, _, err := lease.Read(ctx, e.kv, "p.0")
		return errors.Is(err, lease.ErrFree)
	})

	if _, err := lease.Decode([]byte("nope")); err == nil {
		t.Fatal("Decode accepted garbage")
	}
	if _, err := lease.Decode([]byte(`{"holder":"x"}`)); err == nil {
		t.Fatal("Decode accepted a value without nonce")
	}
}

func TestOrphanThenReleaseDeletes(t *testing.T) {
	e := newEnv(t, 2*time.Second)
	l := acquire(t, e.kv, "p.0", config(t, "a"))
	l.Orphan()
	l.Orphan() // idempotent
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), lease.ErrOrphaned) {
		t.Fatalf("err %v, want ErrOrphaned", l.Err())
	}
	acquire(t, e.kv, "p.0", config(t, "b"))
}
