package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
)

// renews records what Config.Renewed is told.
type renews struct {
	mu   sync.Mutex
	took []time.Duration
	errs []error
}

func (r *renews) record(d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.took = append(r.took, d)
	r.errs = append(r.errs, err)
}

func (r *renews) get() ([]time.Duration, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.took...), append([]error(nil), r.errs...)
}

// Config.Renewed sees every renew attempt with its round trip: the
// successful ones with a nil error, and the one that found the key taken
// with the conflict.
func TestRenewedReportsEveryAttempt(t *testing.T) {
	const ttl = time.Second
	e := newEnv(t, ttl)
	var r renews
	cfg := config(t, "holder")
	cfg.Renewed = r.record
	l := acquire(t, e.kv, "p.0", cfg)
	testwait.Eventually(t, 5*time.Second, "three renews reported", func() bool {
		took, _ := r.get()
		return len(took) >= 3
	})
	took, errs := r.get()
	for i := range took {
		if errs[i] != nil || took[i] <= 0 || took[i] >= ttl/3 {
			t.Fatalf("renew %d: took %s, err %v; want a landed renew within one period", i, took[i], errs[i])
		}
	}
	if _, err := e.kv.Put(context.Background(), "p.0", []byte(`{"holder":"intruder","nonce":"x"}`)); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*time.Second, "the lease is lost", func() bool { return !l.Trusted() })
	_, errs = r.get()
	if last := errs[len(errs)-1]; last == nil {
		t.Fatal("the renew that lost the key reported no error, want its conflict")
	}
	if !errors.Is(l.Err(), lease.ErrLost) {
		t.Fatalf("lease ended with %v, want ErrLost", l.Err())
	}
}
