package keylane

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestStaleOwnerWriteIsFenced pauses a handler inside its critical section
// (after reading the state, before writing it) while ignoring its context,
// as a handler stuck in a GC pause or a slow call would. The partition
// moves to another worker, which runs the same job again and writes it.
// When the paused handler resumes, its write must be refused by the fence
// check, and the job's effect must exist exactly once.
func TestStaleOwnerWriteIsFenced(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	key := "sku:fenced"
	paused := make(chan struct{})
	resume := make(chan struct{})
	staleErr := make(chan error, 1)

	stA := NewState(e.topo.State)
	a := e.worker("wa", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		// Deliberately ignores ctx, the way a stuck call would.
		_, err := stA.Apply(context.Background(), j, func(cur []byte) ([]byte, []byte, error) {
			close(paused)
			<-resume
			return add(1)(cur)
		})
		staleErr <- err
		return nil, err
	}), nil)
	e.waitOwned(a)
	if _, err := e.client.Submit(ctx(t), key, nil, WithID("the-job")); err != nil {
		t.Fatal(err)
	}
	<-paused
	leaseA := ownerOf(a, 0).Lease()
	fenceA := leaseA.Fence()
	var once sync.Once
	unpause := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(unpause) // before the workers stop, whatever happens

	// The worker loses its lease: here because someone deletes it; in
	// production because the process was paused past the TTL.
	lkey := e.topo.Names.LeaseKey(0)
	if err := e.topo.Leases.Delete(ctx(t), lkey); err != nil {
		t.Fatal(err)
	}
	select {
	case <-leaseA.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("worker A did not notice the loss")
	}

	// Worker B takes the orphaned partition and runs the job again.
	stB := NewState(e.topo.State)
	b := e.worker("wb", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		return stB.Apply(ctx, j, add(1))
	}), nil)
	testwait.Eventually(t, 10*time.Second, "worker B owns the partition", func() bool { return len(b.Owned()) == 1 })
	testwait.Eventually(t, 10*time.Second, "worker B applied the job", func() bool {
		got, err := stB.Get(ctx(t), key)
		return err == nil && got.JobID == "the-job"
	})
	got, _ := stB.Get(ctx(t), key)
	if got.Fence <= fenceA {
		t.Fatalf("B wrote with fence %d, not above A's %d", got.Fence, fenceA)
	}

	// A resumes and tries to write.
	unpause()
	select {
	case err := <-staleErr:
		if !errors.Is(err, ErrStaleFence) {
			t.Fatalf("the stale owner's write returned %v, want ErrStaleFence", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the paused handler never finished")
	}
	got, _ = stB.Get(ctx(t), key)
	if v, _ := strconv.Atoi(string(got.Value)); v != 1 {
		t.Fatalf("value %d after one job run twice (once stale): want 1", v)
	}
}
