package fallback_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keylane/keylane/fallback"
	"github.com/keylane/keylane/internal/testwait"
)

func TestFairOrder(t *testing.T) {
	l, c := newLocker(t, nil)
	key := uniqueKey(t)
	fm := l.FairMutex(key)
	ctx := ctxT(t, 30*time.Second)
	_, _, queueKey, _, _ := fallback.KeysOf(nil, key)
	held, err := fm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 8
	var mu sync.Mutex
	var order []int
	errc := make(chan error, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			lk, err := fm.Lock(ctx)
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			errc <- lk.Unlock(ctx)
		})
		// Arrival i is complete once waiter i is queued.
		testwait.Eventually(t, 5*time.Second, "waiter queued", func() bool { return c.LLen(ctx, queueKey).Val() == int64(i+1) })
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := []int{0, 1, 2, 3, 4, 5, 6, 7}
	if !slices.Equal(order, want) {
		t.Fatalf("acquisition order %v, want arrival order %v", order, want)
	}
}

// TestFairDeadWaiter queues a waiter that never polls again (its process
// died): it blocks the queue only until its wait timeout.
func TestFairDeadWaiter(t *testing.T) {
	const waitTimeout = 600 * time.Millisecond
	cfg := &fallback.Config{FairWaitTimeout: waitTimeout}
	l, c := newLocker(t, cfg)
	key := uniqueKey(t)
	ctx := ctxT(t, 20*time.Second)
	_, _, queueKey, timeoutKey, _ := fallback.KeysOf(cfg, key)
	now := c.Time(ctx).Val()
	c.RPush(ctx, queueKey, "dead")
	c.ZAdd(ctx, timeoutKey, redis.Z{Score: float64(now.Add(waitTimeout).UnixMilli()), Member: "dead"})

	fm := l.FairMutex(key)
	if _, err := fm.TryLock(ctx); err == nil {
		t.Fatal("TryLock jumped the queue")
	}
	start := time.Now()
	lk, err := fm.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	if waited > waitTimeout+2*time.Second {
		t.Fatalf("dead waiter blocked the queue for %v (timeout %v)", waited, waitTimeout)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.LLen(ctx, queueKey).Val(); n != 0 {
		t.Fatalf("queue length %d after the dead waiter's timeout", n)
	}
}
