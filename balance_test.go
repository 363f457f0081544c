package keylane

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
)

func owners(ws ...*Worker) map[int]string {
	m := map[int]string{}
	for _, w := range ws {
		for _, p := range w.Owned() {
			m[p] = w.ID()
		}
	}
	return m
}

// TestBalancingMovesOnlyWhatMust starts two workers, adds a third and stops
// one, checking each time that the partitions spread evenly, end where the
// sticky assignment (partition.Assign) puts them given where they were, and
// that only those that had to move moved.
func TestBalancingMovesOnlyWhatMust(t *testing.T) {
	const n, ttl = 12, 10 * time.Second
	// A long TTL: the hand-over below is told from a take-over by expiry
	// by when it happens relative to the leases' expiry.
	e := newEnv(t, TopologyConfig{Partitions: n, LeaseTTL: ttl})
	a := e.worker("wa", echo(), nil)
	b := e.worker("wb", echo(), nil)
	// want is where Assign puts the partitions among members, starting
	// from the owners in from.
	want := func(from map[int]string, members ...string) map[int]string {
		current := make([]string, n)
		for p, o := range from {
			current[p] = o
		}
		m := map[int]string{}
		for p, o := range partition.Assign(n, members, current, nil) {
			m[p] = o
		}
		return m
	}
	testwait.Eventually(t, 10*time.Second, "two workers own 6 each", func() bool {
		return evenlySpread(owners(a, b), n, []string{"wa", "wb"})
	})
	before := owners(a, b)
	c := e.worker("wc", echo(), nil)
	testwait.Eventually(t, 10*time.Second, "three workers own 4 each, wc what the others held above 4", func() bool {
		return mapsEqual(owners(a, b, c), want(before, "wa", "wb", "wc"))
	})
	after := owners(a, b, c)
	for p, o := range after {
		if before[p] != o && o != "wc" {
			t.Errorf("partition %d moved from %s to %s; only moves to the new worker are needed", p, before[p], o)
		}
	}
	if !evenlySpread(after, n, []string{"wa", "wb", "wc"}) {
		t.Errorf("three workers own %v: not 4 each", after)
	}
	// Graceful stop: wc releases every lease it holds and the survivors
	// take them over at the release, not when the leases expire. That is
	// asserted by mechanism, not by the clock (a "well under a second"
	// check failed at 1.01s on a loaded machine): wc counts each lease
	// released and none lost, and the survivors own them before the
	// earliest moment any of wc's leases could have expired on its own
	// (its trust deadline as read before the stop, which comes
	// SafetyMargin before the server expires the entry, and only moves
	// later with renewals). A take-over by expiry cannot come sooner, so
	// theirs followed the releases; with a TTL of 10s that leaves seconds
	// of room to a hand-over that takes milliseconds.
	held := countOf(after, "wc")
	var expiresNoSooner time.Time
	for _, tn := range c.Tenures() {
		if at := time.Now().Add(tn.TrustedFor); expiresNoSooner.IsZero() || at.Before(expiresNoSooner) {
			expiresNoSooner = at
		}
	}
	released := c.Stats().Released
	start := time.Now()
	stopCtx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 2*ttl, "survivors own everything again, 6 each", func() bool {
		return mapsEqual(owners(a, b), want(after, "wa", "wb"))
	})
	tookOver := time.Now()
	if s := c.Stats(); s.Released-released != int64(held) || s.Lost != 0 {
		t.Errorf("wc released %d leases and lost %d; want its %d released, none lost", s.Released-released, s.Lost, held)
	}
	if !tookOver.Before(expiresNoSooner) {
		t.Errorf("the survivors owned wc's partitions at %s, after its leases could have expired by TTL (%s): a take-over by expiry, not a hand-over",
			tookOver.Format(time.StampMilli), expiresNoSooner.Format(time.StampMilli))
	}
	for p, o := range owners(a, b) {
		if after[p] != "wc" && after[p] != o {
			t.Errorf("partition %d moved from %s to %s when wc left; only wc's partitions needed to move", p, after[p], o)
		}
	}
	t.Logf("graceful hand-over of %d partitions took %s (seen by polling)", held, tookOver.Sub(start))
}

// ownerOf returns the owner of partition p on w, nil when w runs none
// (one whose lease ended while it winds down counts).
func ownerOf(w *Worker, p int) *tenure.Owner {
	for _, h := range w.bal.Held() {
		if h.Partition == p {
			return h.Owner
		}
	}
	return nil
}

func countOf(m map[int]string, v string) int {
	n := 0
	for _, o := range m {
		if o == v {
			n++
		}
	}
	return n
}

func mapsEqual(a, b map[int]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestLeaseLossCancelsHandlersAndSkipsAck takes a partition's lease away
// from its owner behind its back: the running handler's context must be
// cancelled, its job must not be acked, and it must run again once the
// worker owns the partition again.
func TestLeaseLossCancelsHandlersAndSkipsAck(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	var runs, cancelled atomic.Int64
	started := make(chan struct{}, 4)
	w := e.worker("w1", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		if runs.Add(1) == 1 {
			started <- struct{}{}
			<-ctx.Done()
			cancelled.Add(1)
			return nil, ctx.Err()
		}
		return []byte("second run"), nil
	}), nil)
	e.waitOwned(w)
	key := keyIn(1, 2, "seat:")
	callErr := make(chan error, 1)
	var res []byte
	go func() {
		var err error
		res, err = e.client.Call(context.Background(), key, nil)
		callErr <- err
	}()
	<-started
	// Someone else takes the lease: delete it and create our own entry.
	lkey := e.topo.Names.LeaseKey(1)
	_, rev, err := lease.Read(ctx(t), e.topo.Leases, lkey)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.topo.Leases.Delete(ctx(t), lkey); err != nil {
		t.Fatal(err)
	}
	thief, err := lease.Acquire(ctx(t), e.topo.Leases, lkey, lease.Config{Holder: "thief", TTL: e.topo.Config.LeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	if thief.Fence() <= rev {
		t.Fatalf("thief fence %d not above the owner's %d", thief.Fence(), rev)
	}
	testwait.Eventually(t, 5*time.Second, "handler context cancelled", func() bool { return cancelled.Load() == 1 })
	if slices.Contains(w.Owned(), 1) {
		testwait.Eventually(t, 5*time.Second, "worker steps down", func() bool { return !slices.Contains(w.Owned(), 1) })
	}
	// The thief leaves; the worker takes the partition back and the job,
	// never acked, runs again.
	if err := thief.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-callErr:
		if err != nil || string(res) != "second run" {
			t.Fatalf("Call = %q, %v", res, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("job never ran again after the lease came back")
	}
	// The reply goes out before the ack and the count: wait for them.
	testwait.Eventually(t, 5*time.Second, "one acked job", func() bool { return w.Stats().Succeeded == 1 })
	if s := w.Stats(); s.Lost < 1 || s.Succeeded != 1 {
		t.Fatalf("stats %+v: want a lost lease and one acked job", s)
	}
	if runs.Load() != 2 {
		t.Fatalf("runs = %d, want 2", runs.Load())
	}
}

// TestRestartWithSameIDWaitsForOldEntry: a worker that crashed and comes
// back under the same ID registers once its old member entry expires; a
// live twin is refused with a clear error.
func TestRestartWithSameIDWaitsForOldEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	// A crashed worker's member entry, left to expire.
	old, err := lease.Acquire(ctx(t), e.topo.Members, "w1", lease.Config{Holder: "w1", TTL: e.topo.Config.LeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	old.Orphan()
	start := time.Now()
	w := e.worker("w1", echo(), nil)
	e.waitOwned(w)
	t.Logf("registered %s after the old entry", time.Since(start))
	twin, err := NewWorker(natstest.Connect(t, e.srv), WorkerConfig{Topology: e.topo.Config, Handler: echo(), ID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := twin.Start(ctx(t)); err == nil || !errors.Is(err, lease.ErrNotAcquired) {
		_ = twin.Stop(ctx(t))
		t.Fatalf("a live twin started: %v", err)
	}
}

// TestOrphanTakenWhenDesiredOwnerDoesNotClaim: a member that never claims
// the partitions assigned to it (here a bare member entry) does not leave
// them without an owner: after a TTL free the worker takes them as
// orphans.
func TestOrphanTakenWhenDesiredOwnerDoesNotClaim(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	ttl := e.topo.Config.LeaseTTL
	ghost, err := lease.Acquire(ctx(t), e.topo.Members, "ghost", lease.Config{Holder: "ghost", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ghost.Release(context.Background()) })
	if assigned := partition.Assign(4, []string{"wa", "ghost"}, nil, nil); !slices.Contains(assigned, "ghost") {
		t.Fatalf("ghost is assigned nothing (%v): the test proves nothing", assigned)
	}
	start := time.Now()
	w := e.worker("wa", echo(), nil)
	e.waitOwned(w)
	if d := time.Since(start); d < ttl {
		t.Errorf("wa owned every partition after %s, before ghost's were free for a TTL (%s)", d, ttl)
	}
	if isClosed(ghost.Done()) {
		t.Fatalf("ghost's member entry lapsed (%v): the test proves nothing", ghost.Err())
	}
}
