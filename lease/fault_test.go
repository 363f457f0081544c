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

// staleKV answers the first stale gets of the bucket with an entry read
// earlier, as a replica that has not applied the newest write does (a KV
// get is a direct get, which any replica answers).
type staleKV struct {
	jetstream.KeyValue
	old   jetstream.KeyValueEntry
	stale atomic.Int32
}

func (s *staleKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if s.stale.Add(-1) >= 0 {
		return s.old, nil
	}
	return s.KeyValue.Get(ctx, key)
}

// A renew that landed after its reply was lost (here: written behind the
// lease's back with its own value) makes Release's delete conflict. The
// read-back that follows may come from a replica behind, which still
// shows the old revision: Release reads again until it sees past it, then
// deletes, and the key is free. It failed once with "read revision X, not
// past X, after a conflict: a replica behind", which made a worker's
// graceful stop exit 1 in the cluster e2e.
func TestReleaseRereadsAStaleReplica(t *testing.T) {
	// No renew during the test: the first comes at TTL/3, 10 s, and a
	// renew now would find the entry moved and end the lease as lost.
	e := newEnv(t, 30*time.Second)
	kv := &staleKV{KeyValue: e.kv}
	l := acquire(t, kv, "p.0", config(t, "holder"))
	old, err := e.kv.Get(t.Context(), "p.0")
	if err != nil {
		t.Fatal(err)
	}
	if old.Revision() != l.Revision() {
		t.Fatalf("read revision %d, lease at %d", old.Revision(), l.Revision())
	}
	landed, err := e.kv.Update(t.Context(), "p.0", old.Value(), old.Revision())
	if err != nil {
		t.Fatal(err)
	}
	kv.old = old
	kv.stale.Store(3)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release after a renew that landed at %d (lease at %d) and a stale read: %v", landed, old.Revision(), err)
	}
	if kv.stale.Load() >= 0 {
		t.Fatalf("the stale reads were not all asked for (%d left): the test did not test", kv.stale.Load()+1)
	}
	if _, err := e.kv.Get(t.Context(), "p.0"); !errors.Is(err, jetstream.ErrKeyDeleted) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("entry after release: %v, want deleted", err)
	}
	acquire(t, e.kv, "p.0", config(t, "successor"))
}
