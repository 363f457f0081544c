package keylanepg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// TestStaleFenceFailsAndChangesNothing applies a group under fence 2, as
// a new owner would, then one under fence 1, as the deposed owner would:
// the old group fails with a StaleFenceError naming both fences, runs no
// job and writes nothing. Another partition's fence is its own.
func TestStaleFenceFailsAndChangesNothing(t *testing.T) {
	_, db := startShop(t, 4)
	ctx := context.Background()
	setStock(t, db, "a", 10)
	if _, err := keylanepg.Apply(ctx, db, group(0, 2, buy("new1", "a")), shop.Sell); err != nil {
		t.Fatal(err)
	}
	h := count(shop.Sell, "old1", "old2")
	_, err := keylanepg.Apply(ctx, db, group(0, 1, buy("old1", "a"), buy("old2", "a")), h)
	var sf *keylanepg.StaleFenceError
	if !errors.As(err, &sf) || sf.Fence != 1 || sf.Committed != 2 || sf.Partition != 0 || !errors.Is(err, keylane.ErrStaleFence) {
		t.Fatalf("stale group: %v, want a StaleFenceError of fence 1 against 2", err)
	}
	if h.total() != 0 {
		t.Errorf("the stale group ran %d jobs", h.total())
	}
	if a := audit(t, db, "a"); a != (shop.Audit{Stock: 9, Orders: 1, Units: 1}) {
		t.Errorf("audit after the stale group: %+v", a)
	}
	if got, _ := keylanepg.Lookup(ctx, db, ns, []string{"old1", "old2"}); len(got) != 0 {
		t.Errorf("the stale group's jobs are recorded: %v", got)
	}
	if _, err := keylanepg.Apply(ctx, db, group(1, 1, buy("p1", "a")), shop.Sell); err != nil {
		t.Errorf("partition 1 under fence 1: %v", err)
	}
}

// blocking is a Handler that sells, then waits for release before it
// returns: a transaction held open mid-group, as a slow or paused owner's.
type blocking struct {
	ran     chan string
	release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{ran: make(chan string, 16), release: make(chan struct{})}
}

func (b *blocking) Handle(ctx context.Context, tx pgx.Tx, job keylane.Job) ([]byte, error) {
	res, err := shop.Sell.Handle(ctx, tx, job)
	b.ran <- job.ID
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return res, err
}

type applied struct {
	out []keylanepg.Outcome
	err error
}

func applyAsync(db *pgxpool.Pool, g keylanepg.Group, h keylanepg.Handler, opts ...keylanepg.ApplyOpt) chan applied {
	ch := make(chan applied, 1)
	go func() {
		out, err := keylanepg.Apply(context.Background(), db, g, h, opts...)
		ch <- applied{out, err}
	}()
	return ch
}

// waitForFenceLock waits until n transactions wait for a lock on the
// fence row.
func waitForFenceLock(t *testing.T, db *pgxpool.Pool, n int64) {
	t.Helper()
	testwait.Eventually(t, 30*time.Second, "a transaction waiting on the fence row", func() bool {
		return rowCount(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO keylane_fences%'`) == n
	})
}

func wait(t *testing.T, ch chan applied) applied {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(60 * time.Second):
		t.Fatal("Apply did not return")
	}
	return applied{}
}

// TestConcurrentOwnersSerializeOnTheFenceRow runs two owners' groups of
// one partition at once, the deposed owner's (fence 1) and its
// successor's (fence 2), both carrying the redelivered job j: whichever
// takes the fence row first, the other waits for its commit. The old one
// first: it commits, and the new one finds j recorded and does not apply
// it again. The new one first: the old one fails with a StaleFenceError,
// having run nothing. The old one paused mid-group with IdleTimeout: the
// database ends its session, the new one goes on, and the old one's
// writes are rolled back.
func TestConcurrentOwnersSerializeOnTheFenceRow(t *testing.T) {
	_, db := startShop(t, 8)
	ctx := context.Background()

	t.Run("OldFirst", func(t *testing.T) {
		setStock(t, db, "old-first", 10)
		old := newBlocking()
		oldDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 10, Fence: 1, Jobs: []keylane.Job{buy("of-j", "old-first")}}, old)
		<-old.ran
		h := count(shop.Sell, "of-j", "of-new")
		newDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 10, Fence: 2, Jobs: []keylane.Job{buy("of-j", "old-first"), buy("of-new", "old-first")}}, h)
		waitForFenceLock(t, db, 1)
		close(old.release)
		if a := wait(t, oldDone); a.err != nil || a.out[0].Status != keylanepg.Applied {
			t.Fatalf("old owner: %+v", a)
		}
		a := wait(t, newDone)
		if a.err != nil || a.out[0].Status != keylanepg.Recorded || a.out[0].Fence != 1 || a.out[1].Status != keylanepg.Applied {
			t.Fatalf("new owner: %+v", a)
		}
		if n := h.runs["of-j"].Load(); n != 0 {
			t.Errorf("the new owner ran j %d times after the old one committed it", n)
		}
		if au := audit(t, db, "old-first"); au != (shop.Audit{Stock: 8, Orders: 2, Units: 2}) {
			t.Errorf("audit: %+v", au)
		}
	})

	t.Run("NewFirst", func(t *testing.T) {
		setStock(t, db, "new-first", 10)
		nw := newBlocking()
		newDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 11, Fence: 2, Jobs: []keylane.Job{buy("nf-j", "new-first")}}, nw)
		<-nw.ran
		h := count(shop.Sell, "nf-j", "nf-old")
		oldDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 11, Fence: 1, Jobs: []keylane.Job{buy("nf-old", "new-first"), buy("nf-j", "new-first")}}, h)
		waitForFenceLock(t, db, 1)
		close(nw.release)
		if a := wait(t, newDone); a.err != nil || a.out[0].Status != keylanepg.Applied {
			t.Fatalf("new owner: %+v", a)
		}
		a := wait(t, oldDone)
		var sf *keylanepg.StaleFenceError
		if !errors.As(a.err, &sf) || sf.Committed != 2 {
			t.Fatalf("old owner after the new one committed: %+v, want a StaleFenceError", a)
		}
		if h.total() != 0 {
			t.Errorf("the deposed owner ran %d jobs", h.total())
		}
		if au := audit(t, db, "new-first"); au != (shop.Audit{Stock: 9, Orders: 1, Units: 1}) {
			t.Errorf("audit: %+v", au)
		}
	})

	t.Run("OldPausedPastIdleTimeout", func(t *testing.T) {
		setStock(t, db, "paused", 10)
		old := newBlocking()
		oldDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 12, Fence: 1, Jobs: []keylane.Job{buy("p-old", "paused")}}, old, keylanepg.IdleTimeout(300*time.Millisecond))
		<-old.ran
		// The old owner is paused in its handler, its transaction open and
		// the fence row locked. The new owner waits, then goes on once the
		// database has ended the idle session.
		newDone := applyAsync(db, keylanepg.Group{Namespace: ns, Partition: 12, Fence: 2, Jobs: []keylane.Job{buy("p-new", "paused")}}, shop.Sell)
		if a := wait(t, newDone); a.err != nil || a.out[0].Status != keylanepg.Applied {
			t.Fatalf("new owner: %+v", a)
		}
		close(old.release) // the paused owner resumes and tries to commit
		if a := wait(t, oldDone); a.err == nil {
			t.Fatalf("the paused owner's group committed after its successor's: %+v", a)
		} else {
			t.Logf("paused owner: %v", a.err)
		}
		if au := audit(t, db, "paused"); au != (shop.Audit{Stock: 9, Orders: 1, Units: 1}) {
			t.Errorf("audit: %+v", au)
		}
		if got, _ := keylanepg.Lookup(ctx, db, ns, []string{"p-old"}); len(got) != 0 {
			t.Errorf("the paused owner's job is recorded: %v", got)
		}
	})
}
