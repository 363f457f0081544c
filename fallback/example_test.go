package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keylane/keylane/fallback"
)

func ExampleLocker_Do() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	locker, err := fallback.New(rdb, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	ctx := context.Background()
	err = locker.Do(ctx, "example-do", func(ctx context.Context, fence uint64) error {
		// ctx is cancelled if the lock is lost; pass fence to the resource.
		fmt.Println("in the critical section, fence > 0:", fence > 0)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// in the critical section, fence > 0: true
	// err: <nil>
}

// store is a protected resource that checks fencing tokens: it refuses a
// write whose fence is not above the last one it accepted, so a holder that
// lost its lock (GC pause, partition) cannot overwrite a newer holder.
type store struct {
	mu        sync.Mutex
	lastFence uint64
	value     string
}

var errStaleFence = errors.New("store: stale fence")

func (s *store) Write(fence uint64, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.lastFence {
		return errStaleFence
	}
	s.lastFence, s.value = fence, v
	return nil
}

func ExampleLock_Fence() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	locker, err := fallback.New(rdb, nil)
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	ctx := context.Background()
	m := locker.Mutex("example-fence")
	db := &store{}

	// The first holder's lease runs out while it is paused.
	slow, _ := m.TryLock(ctx, fallback.WithLeaseTime(50*time.Millisecond))
	<-slow.Done()

	// A second holder gets the lock and writes with its larger fence.
	fast, _ := m.Lock(ctx)
	fmt.Println("second write:", db.Write(fast.Fence(), "second"))
	_ = fast.Unlock(ctx)

	// The first holder wakes up and tries to write: the store refuses.
	fmt.Println("first write:", db.Write(slow.Fence(), "first"))
	fmt.Println("unlock:", errors.Is(slow.Unlock(ctx), fallback.ErrNotHeld))
	// Output:
	// second write: <nil>
	// first write: store: stale fence
	// unlock: true
}

func ExampleRedLock() {
	// One client per independent Redis server; here the same one five times
	// would defeat the purpose, so this example only shows the calls.
	var clients []fallback.Client // e.g. five *redis.Client
	rl, err := fallback.NewRedLock(clients, &fallback.Config{TTL: 10 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rl.Close()
	_ = rl.Do(context.Background(), "report", func(ctx context.Context, fence uint64) error {
		return nil
	})
	// Output:
	// fallback: RedLock needs at least one client
}
