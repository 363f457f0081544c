package lease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// faultyKV injects faults into Update, the renew, in front of a real bucket.
type faultyKV struct {
	jetstream.KeyValue
	update func(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
}

func (f *faultyKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return f.update(ctx, key, value, rev)
}

// A renew that lands but whose reply is lost is an unknown outcome; the
// next attempt sees a revision mismatch, reads the entry back, finds its
// own nonce and carries on.
func TestRenewWithLostReplyIsAdopted(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	var calls atomic.Int32
	var landed atomic.Uint64
	kv := &faultyKV{KeyValue: e.kv}
	kv.update = func(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
		newRev, err := e.kv.Update(ctx, key, value, rev)
		if calls.Add(1) == 1 && err == nil {
			landed.Store(newRev)
			return 0, context.DeadlineExceeded // the reply went missing
		}
		return newRev, err
	}
	l := acquire(t, kv, "p.0", config(t, "holder"))
	testwait.Eventually(t, 2*ttl, "the revision moves past the write whose reply was lost", func() bool {
		return landed.Load() != 0 && l.Revision() > landed.Load()
	})
	// It stays held and trusted for a few more TTLs.
	end := time.Now().Add(2 * ttl)
	for time.Now().Before(end) {
		if !l.Trusted() {
			t.Fatalf("lease not trusted: %v", l.Err())
		}
		time.Sleep(20 * time.Millisecond) // sampling period
	}
	t.Logf("reply of revision %d lost, lease carried on to revision %d", landed.Load(), l.Revision())
}

// A holder cut off from the server (renews time out) stops trusting its
// lease at its trust deadline and ends it with ErrExpired, before the server
// expires the entry and someone else can take it.
func TestPartitionedHolderExpires(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	kv := &faultyKV{KeyValue: e.kv}
	kv.update = func(ctx context.Context, _ string, _ []byte, _ uint64) (uint64, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	l := acquire(t, kv, "p.0", config(t, "holder"))
	deadline := l.TrustDeadline()
	contender := campaignAsync(t, t.Context(), e.kv, "p.0", config(t, "contender"))

	testwait.Eventually(t, 2*ttl, "Done closes", func() bool {
		select {
		case <-l.Done():
			return true
		default:
			return false
		}
	})
	late := time.Since(deadline)
	t.Logf("Done closed %s after the trust deadline: %v", late, l.Err())
	if !errors.Is(l.Err(), lease.ErrExpired) || l.Trusted() {
		t.Fatalf("err %v, trusted %v; want ErrExpired, untrusted", l.Err(), l.Trusted())
	}
	if late < 0 || late > 250*time.Millisecond { // a timer's wake-up under -race
		t.Fatalf("Done closed %s after the trust deadline, want promptly", late)
	}
	r := waitResult(t, contender, 3*ttl)
	if !r.at.After(deadline) {
		t.Fatal("contender acquired before the partitioned holder's trust deadline")
	}
	t.Logf("contender took over %s after the holder's trust deadline", r.at.Sub(deadline))
}
