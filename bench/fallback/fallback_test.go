package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/keylane/keylane/fallback"
)

// buyFunc runs one flash-sale purchase under the lock named key and reports
// how many calls into the library's lock API it took.
type buyFunc func(ctx context.Context, key string, purchase func(ctx context.Context) error) (attempts int, err error)

type lockImpl struct {
	name string
	open func(b *testing.B, rdb *redis.Client) buyFunc
}

var lockImpls = []lockImpl{
	{"keylane", func(b *testing.B, rdb *redis.Client) buyFunc {
		l, err := fallback.New(rdb, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close() })
		return func(ctx context.Context, key string, purchase func(context.Context) error) (int, error) {
			return 1, l.Do(ctx, key, func(ctx context.Context, _ uint64) error { return purchase(ctx) })
		}
	}},
	// redsync with its defaults: 32 tries, 50–250 ms random delay, 8 s
	// expiry. When all tries fail the harness starts again.
	{"redsync", func(b *testing.B, rdb *redis.Client) buyFunc {
		rs := redsync.New(goredis.NewPool(rdb))
		return func(ctx context.Context, key string, purchase func(context.Context) error) (int, error) {
			for attempts := 1; ; attempts++ {
				m := rs.NewMutex(key)
				if err := m.LockContext(ctx); err != nil {
					if ctx.Err() != nil {
						return attempts, err
					}
					continue
				}
				err := purchase(ctx)
				if _, uerr := m.UnlockContext(ctx); uerr != nil {
					err = errors.Join(err, uerr)
				}
				return attempts, err
			}
		}
	}},
	// redislock with its default: no retry (NoRetry). The harness tries
	// again at once, so this is a spin; lock-calls/op shows its cost.
	{"redislock", func(b *testing.B, rdb *redis.Client) buyFunc {
		rl := redislock.New(rdb)
		return func(ctx context.Context, key string, purchase func(context.Context) error) (int, error) {
			for attempts := 1; ; attempts++ {
				lock, err := rl.Obtain(ctx, key, 8*time.Second, nil)
				if errors.Is(err, redislock.ErrNotObtained) {
					continue
				}
				if err != nil {
					return attempts, err
				}
				err = purchase(ctx)
				if rerr := lock.Release(ctx); rerr != nil {
					err = errors.Join(err, rerr)
				}
				return attempts, err
			}
		}
	}},
}

// BenchmarkFlashSale: G goroutines buy from one hot stock counter. Each
// purchase takes the lock, GETs the stock, and SETs it one lower if it is
// above zero. The stock is 3/4 of b.N, so the sale sells out; the check at
// the end fails on any oversell.
//
//	go test -run '^$' -bench FlashSale -benchtime 2000x ./fallback/
func BenchmarkFlashSale(b *testing.B) {
	for _, g := range []int{8, 64, 256} {
		for _, impl := range lockImpls {
			b.Run(fmt.Sprintf("g=%d/%s", g, impl.name), func(b *testing.B) {
				flashSale(b, g, impl)
			})
		}
	}
}

func flashSale(b *testing.B, goroutines int, impl lockImpl) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	buy := impl.open(b, rdb)
	ctx := context.Background()
	key := fmt.Sprintf("bench-%s-%d-%d", impl.name, goroutines, keySeq.Add(1))
	stockKey := key + ":stock"
	stock := max(1, b.N*3/4)
	if err := rdb.Set(ctx, stockKey, stock, 0).Err(); err != nil {
		b.Fatal(err)
	}
	purchaseFn := func(sold *atomic.Int64) func(context.Context) error {
		return func(ctx context.Context) error {
			v, err := rdb.Get(ctx, stockKey).Int()
			if err != nil {
				return err
			}
			if v <= 0 {
				return nil
			}
			if err := rdb.Set(ctx, stockKey, v-1, 0).Err(); err != nil {
				return err
			}
			sold.Add(1)
			return nil
		}
	}

	var next, sold, attempts atomic.Int64
	next.Store(int64(b.N))
	purchase := purchaseFn(&sold)
	lat := make([][]time.Duration, goroutines)
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range goroutines {
		wg.Go(func() {
			for next.Add(-1) >= 0 {
				t0 := time.Now()
				n, err := buy(ctx, key, purchase)
				lat[i] = append(lat[i], time.Since(t0))
				attempts.Add(int64(n))
				if err != nil {
					errOnce.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	left, err := rdb.Get(ctx, stockKey).Int()
	if err != nil {
		b.Fatal(err)
	}
	if got := sold.Load(); got+int64(left) != int64(stock) || left < 0 || got > int64(stock) {
		b.Fatalf("oversell: stock %d, sold %d, left %d", stock, got, left)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(attempts.Load())/float64(b.N), "lock-calls/op")
}
