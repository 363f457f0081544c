package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nuid"
)

// shop keeps the stock of SKUs and sells single units of it.
type shop interface {
	// stock sets every SKU's stock to n, before the timed part.
	stock(ctx context.Context, skus []string, n int64) error
	// buy sells one unit of sku if any is left; id names the purchase.
	// sold may be true with an error, when the sale was stored and a later
	// step (an unlock) failed. calls is lock API calls made, 0 if none.
	buy(ctx context.Context, sku, id string) (sold bool, calls int, err error)
	// levels reads the stock of SKUs, after the timed part.
	levels(ctx context.Context, skus []string) ([]int64, error)
}

// bulkShop also takes purchases without a reply for each.
type bulkShop interface {
	shop
	// submit stores purchases of skus, named by ids, to run later.
	submit(ctx context.Context, skus, ids []string) error
	// settle waits until every stored purchase ran.
	settle(ctx context.Context) error
}

// submitChunk is how many purchases a fire-and-forget sale submits at once,
// as sale.Run does; the deadline is checked between chunks.
const submitChunk = 4096

// sell runs workload w through s: stock, the timed purchases, then the
// check of every SKU bought. With bulk set, s must be a bulkShop and
// purchases are submitted, not called. server and worker are the pids to
// measure (0: none); more are further servers, whose usage counts as the
// server's (a cluster's nodes).
func sell(ctx context.Context, w Workload, s shop, bulk bool, server, worker int, more ...int) (Result, error) {
	ctx, cancel := context.WithTimeout(ctx, hardLimit(w))
	defer cancel()
	picks := w.picks()
	prefix := "sku:" + strings.ToLower(nuid.Next()[:8]) + ":"
	name := func(i int) string { return prefix + strconv.Itoa(i) }
	if err := s.stock(ctx, names(distinct(picks, w.SKUs), name), w.Stock); err != nil {
		return Result{}, fmt.Errorf("stock: %w", err)
	}
	runID := nuid.Next()
	id := func(i int) string { return runID + "-" + strconv.Itoa(i) }

	var res Result
	soldBy := make([]atomic.Int64, w.SKUs)
	var lat []time.Duration
	var issued int
	var err error
	client := os.Getpid() // the buyers; embedded: the worker's process too, so not apart
	if worker == client || worker == 0 {
		client = 0
	}
	m := startMeter(append([]int{server, worker, client}, more...)...)
	start := time.Now()
	deadline := start.Add(w.Duration)
	if bulk {
		issued, err = submitUntil(ctx, s.(bulkShop), picks, deadline, name, id)
	} else {
		issued, lat, err = buyUntil(ctx, w.Buyers, s, picks, deadline, name, id, soldBy, &res)
	}
	res.Elapsed = time.Since(start)
	use := m.end()
	res.Server, res.Worker, res.Client = use[0], use[1], use[2]
	for _, u := range use[3:] {
		res.Server.CPU += u.CPU
		res.Server.RSS += u.RSS
	}
	if err != nil {
		return res, err
	}
	res.Jobs = issued
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50, res.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}

	demand := make([]int64, w.SKUs)
	for _, p := range picks[:issued] {
		demand[p]++
	}
	bought := distinct(picks[:issued], w.SKUs)
	final, err := s.levels(ctx, names(bought, name))
	if err != nil {
		return res, fmt.Errorf("read stock: %w", err)
	}
	for i, k := range bought {
		left := final[i]
		if bulk {
			sold, want := w.Stock-left, min(w.Stock, demand[k])
			res.Sold += sold
			res.Oversold += max(0, sold-want)
			res.Lost += max(0, want-sold)
			continue
		}
		sold := soldBy[k].Load()
		res.Oversold += max(0, sold-w.Stock, -left)
		diff := left - (w.Stock - sold)
		res.Lost += max(0, diff)
		res.Mismatch += max(0, -diff-max(0, -left))
	}
	return res, nil
}

// hardLimit bounds a whole run, setup of the stock and the check included:
// a contender that cannot finish in it fails the run.
func hardLimit(w Workload) time.Duration { return 3*w.Duration + time.Minute }

// buyUntil runs purchases with w.Buyers concurrent buyers until all picks
// ran or the deadline passed, and returns how many started and their
// latencies.
func buyUntil(ctx context.Context, buyers int, s shop, picks []int, deadline time.Time, name, id func(int) string, soldBy []atomic.Int64, res *Result) (int, []time.Duration, error) {
	lat := make([]time.Duration, len(picks))
	var next, failed, calls atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	for range buyers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(picks) {
					return
				}
				t0 := time.Now()
				sold, n, err := s.buy(ctx, name(picks[i]), id(i))
				lat[i] = time.Since(t0)
				calls.Add(int64(n))
				if sold {
					soldBy[picks[i]].Add(1)
				}
				if err != nil {
					failed.Add(1)
					firstErr.Do(func() { res.FirstErr = err.Error() })
				}
			}
		})
	}
	wg.Wait()
	issued := min(int(next.Load()), len(picks))
	res.Failed = failed.Load()
	if issued > 0 && calls.Load() > 0 {
		res.Calls = float64(calls.Load()) / float64(issued)
	}
	for i := range soldBy {
		res.Sold += soldBy[i].Load()
	}
	if err := ctx.Err(); err != nil {
		return issued, nil, fmt.Errorf("purchases not done: %w", err)
	}
	return issued, lat[:issued], nil
}

// submitUntil submits purchases in chunks until all picks are stored or the
// deadline passed, then waits until they ran.
func submitUntil(ctx context.Context, s bulkShop, picks []int, deadline time.Time, name, id func(int) string) (int, error) {
	issued := 0
	for issued < len(picks) && time.Now().Before(deadline) {
		hi := min(issued+submitChunk, len(picks))
		skus, ids := make([]string, 0, hi-issued), make([]string, 0, hi-issued)
		for i := issued; i < hi; i++ {
			skus, ids = append(skus, name(picks[i])), append(ids, id(i))
		}
		if err := s.submit(ctx, skus, ids); err != nil {
			return issued, fmt.Errorf("submit: %w", err)
		}
		issued = hi
	}
	if err := s.settle(ctx); err != nil {
		return issued, fmt.Errorf("wait for the jobs to run: %w", err)
	}
	return issued, nil
}

// distinct returns the SKUs that occur in picks, in order.
func distinct(picks []int, skus int) []int {
	seen := make([]bool, skus)
	var out []int
	for _, p := range picks {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func names(skus []int, name func(int) string) []string {
	out := make([]string, len(skus))
	for i, k := range skus {
		out[i] = name(k)
	}
	return out
}

// settleStream polls backlog until it is zero: a fire-and-forget sale is
// done when its stream holds no job.
func settleStream(ctx context.Context, backlog func(context.Context) (uint64, error)) error {
	for {
		n, err := backlog(ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
