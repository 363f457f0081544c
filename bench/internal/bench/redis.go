package bench

import (
	"context"
	_ "embed"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/keylane/keylane/fallback"
	"github.com/keylane/keylane/internal/redistest"
)

// redisSale sells from stock kept in a redis-server of its own, one
// purchase at a time through buy.
type redisSale struct {
	name string
	kind Kind
	// open returns the purchase of one run, and what closes it.
	open func(rdb *redis.Client, hold time.Duration) (buyFunc, func(), error)

	srv  *redistest.Server
	hold time.Duration
}

// buyFunc sells one unit of the stock kept at key sku.
type buyFunc func(ctx context.Context, sku string) (sold bool, calls int, err error)

func (r *redisSale) Name() string { return r.name }
func (r *redisSale) Kind() Kind   { return r.kind }

// Setup starts a redis-server: with an append-only file synced on every
// write when env.Durable, with no persistence at all otherwise.
func (r *redisSale) Setup(_ context.Context, env Env) error {
	var extra []string
	if env.Durable {
		extra = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	var err error
	r.srv, err = redistest.Start(extra...)
	r.hold = env.Hold
	return err
}

func (r *redisSale) Run(ctx context.Context, w Workload) (Result, error) {
	// A connection per buyer: nobody waits for the pool.
	rdb := redis.NewClient(&redis.Options{Addr: r.srv.Addr, PoolSize: w.Buyers + 8})
	defer rdb.Close()
	buy, closeFn, err := r.open(rdb, r.hold)
	if err != nil {
		return Result{}, err
	}
	defer closeFn()
	return sell(ctx, w, redisShop{rdb, buy}, false, r.srv.PID(), 0)
}

func (r *redisSale) Teardown(context.Context) {
	if r.srv != nil {
		r.srv.Stop()
		r.srv = nil
	}
}

type redisShop struct {
	rdb      *redis.Client
	purchase buyFunc
}

func (s redisShop) stock(ctx context.Context, skus []string, n int64) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range skus {
			p.Set(ctx, k, n, 0)
		}
		return nil
	})
	return err
}

func (s redisShop) levels(ctx context.Context, skus []string) ([]int64, error) {
	cmds := make([]*redis.StringCmd, len(skus))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range skus {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(skus))
	for i, c := range cmds {
		if out[i], err = c.Int64(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s redisShop) buy(ctx context.Context, sku, _ string) (bool, int, error) {
	return s.purchase(ctx, sku)
}

// lockFunc runs critical under the lock named key and returns how many
// calls into the lock library's acquire API it took.
type lockFunc func(ctx context.Context, key string, critical func(ctx context.Context) error) (calls int, err error)

// lockedBuy is the purchase every lock peer runs: under the SKU's lock, GET
// the stock, wait hold (the simulated I/O), and SET it one lower if any is
// left.
func lockedBuy(rdb *redis.Client, hold time.Duration, lock lockFunc) buyFunc {
	return func(ctx context.Context, sku string) (bool, int, error) {
		sold := false
		calls, err := lock(ctx, "lock:"+sku, func(ctx context.Context) error {
			n, err := rdb.Get(ctx, sku).Int64()
			if err != nil {
				return err
			}
			if hold > 0 {
				time.Sleep(hold)
			}
			if n <= 0 {
				return nil
			}
			if err := rdb.Set(ctx, sku, n-1, 0).Err(); err != nil {
				return err
			}
			sold = true
			return nil
		})
		return sold, calls, err
	}
}

// lockTTL is the lock lifetime of redsync's default, used for redislock
// too.
const lockTTL = 8 * time.Second

func fallbackDo(rdb *redis.Client, hold time.Duration) (buyFunc, func(), error) {
	l, err := fallback.New(rdb, nil)
	if err != nil {
		return nil, nil, err
	}
	return lockedBuy(rdb, hold, func(ctx context.Context, key string, critical func(context.Context) error) (int, error) {
		return 1, l.Do(ctx, key, func(ctx context.Context, _ uint64) error { return critical(ctx) })
	}), func() { _ = l.Close() }, nil
}

// redsyncTuned is the tuned redsync: exponential backoff with full jitter
// (a delay drawn uniformly below min(32 ms, 1 ms·2^try)), the usual cure for
// many clients retrying one resource, and tries enough for any run. A
// fixed delay of about 1 ms collapses on a hot key: every waiter's try
// (a SET NX, and a release script when it fails) crowds out the holder.
var redsyncTuned = []redsync.Option{
	redsync.WithTries(100_000),
	redsync.WithRetryDelayFunc(func(try int) time.Duration {
		return rand.N(min(32*time.Millisecond, time.Millisecond<<min(try, 6)))
	}),
}

// openRedsync returns redsync with opts; when all its tries fail
// (ErrFailed) the harness calls Lock again.
func openRedsync(opts ...redsync.Option) func(*redis.Client, time.Duration) (buyFunc, func(), error) {
	return func(rdb *redis.Client, hold time.Duration) (buyFunc, func(), error) {
		rs := redsync.New(goredis.NewPool(rdb))
		return lockedBuy(rdb, hold, func(ctx context.Context, key string, critical func(context.Context) error) (int, error) {
			for calls := 1; ; calls++ {
				m := rs.NewMutex(key, opts...)
				if err := m.LockContext(ctx); err != nil {
					if errors.Is(err, redsync.ErrFailed) && ctx.Err() == nil {
						continue
					}
					return calls, err
				}
				err := critical(ctx)
				if _, uerr := m.UnlockContext(ctx); uerr != nil {
					err = errors.Join(err, uerr)
				}
				return calls, err
			}
		}), func() {}, nil
	}
}

// redislockTuned is the tuned redislock: its own exponential backoff
// (4, 8, 16, 32, 32… ms). The strategy counts retries, so every Obtain
// gets a fresh one.
func redislockTuned() *redislock.Options {
	return &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(time.Millisecond, 32*time.Millisecond)}
}

// openRedislock returns redislock with the options opt returns. With its
// default (opt nil: no retry) Obtain fails at once when the lock is taken
// and the harness calls it again immediately: a spin, whose cost the lock
// calls per purchase show.
func openRedislock(opt func() *redislock.Options) func(*redis.Client, time.Duration) (buyFunc, func(), error) {
	return func(rdb *redis.Client, hold time.Duration) (buyFunc, func(), error) {
		rl := redislock.New(rdb)
		return lockedBuy(rdb, hold, func(ctx context.Context, key string, critical func(context.Context) error) (int, error) {
			for calls := 1; ; calls++ {
				var o *redislock.Options
				if opt != nil {
					o = opt()
				}
				lock, err := rl.Obtain(ctx, key, lockTTL, o)
				if errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
					continue
				}
				if err != nil {
					return calls, err
				}
				err = critical(ctx)
				if rerr := lock.Release(ctx); rerr != nil {
					err = errors.Join(err, rerr)
				}
				return calls, err
			}
		}), func() {}, nil
	}
}

// luaRow names the Lua limit's row.
const luaRow = "Lua EVALSHA"

//go:embed decrement.lua
var decrementLua string

var decrement = redis.NewScript(decrementLua)

// luaLimit sells with one EVALSHA per purchase that checks and decrements
// the stock atomically: no lock at all, the most any Redis design can do.
func luaLimit(rdb *redis.Client, _ time.Duration) (buyFunc, func(), error) {
	return func(ctx context.Context, sku string) (bool, int, error) {
		n, err := decrement.Run(ctx, rdb, []string{sku}).Int()
		return n == 1, 0, err
	}, func() {}, nil
}
