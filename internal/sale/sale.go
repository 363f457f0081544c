package sale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nuid"
)

// Config describes a flash sale: many buyers racing for the stock of a
// few hot SKUs.
type Config struct {
	// SKUs is how many products are on sale. Defaults to 5.
	SKUs int
	// Stock is each SKU's starting stock. Defaults to 1000.
	Stock int64
	// Buyers is how many concurrent buyers there are. Defaults to 64.
	Buyers int
	// Purchases is how many single-unit purchases are attempted in all.
	// Defaults to 10000.
	Purchases int
	// Skew is the Zipf exponent of demand over SKUs (>1; SKU 0 the
	// hottest). Defaults to 1.1.
	Skew float64
	// Even spreads demand evenly over the SKUs instead; Skew is ignored.
	Even bool
	// Prefix names the SKU keys. Defaults to "sku:<random>:" so runs
	// against the same server do not collide.
	Prefix string
	// FireAndForget submits every purchase with SubmitMany instead of Call,
	// then waits until the jobs stream is empty (with other traffic on the
	// namespace, that waits for it too).
	FireAndForget bool
	// Timeout bounds the whole sale. Defaults to 5 minutes.
	Timeout time.Duration
	// Progress, if set, is told how many purchases are done: answered
	// (Call), or gone from the jobs stream once all are stored
	// (FireAndForget). It is called from the buyers' goroutines, so it
	// must be safe for concurrent use.
	Progress func(done int)
}

func (c *Config) setDefaults() {
	if c.SKUs == 0 {
		c.SKUs = 5
	}
	if c.Stock == 0 {
		c.Stock = 1000
	}
	if c.Buyers == 0 {
		c.Buyers = 64
	}
	if c.Purchases == 0 {
		c.Purchases = 10000
	}
	if c.Skew == 0 {
		c.Skew = 1.1
	}
	if c.Prefix == "" {
		c.Prefix = "sku:" + strings.ToLower(nuid.Next()[:8]) + ":"
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Minute
	}
}

// Verdict is the outcome of a sale, with the invariants checked.
type Verdict struct {
	Config  Config
	Sold    int64 // purchases answered "sold"
	Refused int64 // purchases answered "soldout"
	Failed  int64 // purchases that got an error
	// Full counts, by SKU, the purchases refused at admission: the SKU's
	// backlog was full (keylane.ErrKeyBacklogFull), nothing stored. They
	// are neither sold nor failed: the shop says "try again later".
	Full []int64
	// SoldBy counts, by SKU, the purchases answered "sold" (Call mode).
	SoldBy    []int64
	Oversold  int64 // units sold beyond stock: must be 0
	Mismatch  int   // SKUs whose final stock is not start − sold: must be 0
	Final     []int64
	Demand    []int64
	Elapsed   time.Duration
	JobsPerS  float64
	P50, P99  time.Duration
	Max       time.Duration
	MaxPerKey int // most runs of one key seen at once (-1: not observed)
	OutOfOrd  int // runs of a key that started out of stream order
	// FirstError is the first purchase error, if any failed.
	FirstError string
}

// judge checks every SKU: its final stock is start − what was admitted
// (demand less admission refusals, at most the stock), never below zero,
// and, with request-reply, the buyers told "sold" are exactly the units
// taken: more is an oversell (a promise the stock does not back), fewer a
// sale nobody was told of, unless some purchases failed.
func (v *Verdict) judge() {
	c := v.Config
	for i, got := range v.Final {
		taken := c.Stock - got
		if got < 0 {
			v.Oversold += -got
		}
		if taken != min(c.Stock, v.Demand[i]-v.Full[i]) {
			v.Mismatch++
		}
		if c.FireAndForget || i >= len(v.SoldBy) {
			continue
		}
		told := v.SoldBy[i]
		if told > max(taken, 0) {
			v.Oversold += told - max(taken, 0)
		}
		if told != taken && v.Failed == 0 {
			v.Mismatch++
		}
	}
}

// BacklogFull is how many purchases were refused at admission.
func (v Verdict) BacklogFull() int64 {
	var n int64
	for _, f := range v.Full {
		n += f
	}
	return n
}

// OK reports whether every invariant held.
func (v Verdict) OK() bool {
	return v.Oversold == 0 && v.Mismatch == 0 && v.Failed == 0 && v.MaxPerKey <= 1 && v.OutOfOrd == 0
}

// Print writes the verdict for a person.
func (v Verdict) Print(w io.Writer) {
	c := v.Config
	mode := "Call (request-reply)"
	if c.FireAndForget {
		mode = "SubmitMany (fire-and-forget)"
	}
	demand := fmt.Sprintf("zipf s=%.2f", c.Skew)
	switch {
	case c.SKUs == 1:
		demand = "one hot key"
	case c.Even:
		demand = "even demand"
	}
	fmt.Fprintf(w, "flash sale: %d purchases of %d SKUs (stock %d each, %s), %d buyers, %s\n",
		c.Purchases, c.SKUs, c.Stock, demand, c.Buyers, mode)
	for i, f := range v.Final {
		fmt.Fprintf(w, "  %s%-3d demand %6d  sold %6d  final stock %6d\n", c.Prefix, i, v.Demand[i], c.Stock-f, f)
	}
	fmt.Fprintf(w, "sold %d, refused %d, failed %d\n", v.Sold, v.Refused, v.Failed)
	if full := v.BacklogFull(); full > 0 {
		fmt.Fprintf(w, "refused at admission (key backlog full, nothing stored) %d\n", full)
	}
	if v.FirstError != "" {
		fmt.Fprintf(w, "first failure: %s\n", v.FirstError)
	}
	fmt.Fprintf(w, "oversell %d (must be 0), stock mismatches %d (must be 0)\n", v.Oversold, v.Mismatch)
	if v.MaxPerKey >= 0 {
		fmt.Fprintf(w, "max concurrent runs per key %d (must be 1), out-of-order runs %d (must be 0)\n", v.MaxPerKey, v.OutOfOrd)
	}
	fmt.Fprintf(w, "throughput %.0f jobs/s over %s", v.JobsPerS, v.Elapsed.Round(time.Millisecond))
	if !c.FireAndForget {
		fmt.Fprintf(w, ", latency p50 %s p99 %s max %s", round(v.P50), round(v.P99), round(v.Max))
	}
	fmt.Fprintln(w)
	if v.OK() {
		fmt.Fprintln(w, "verdict: OK")
	} else {
		fmt.Fprintln(w, "verdict: FAILED")
	}
}

func round(d time.Duration) time.Duration {
	if d > time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// Run stocks the SKUs, runs the purchases through c and checks the
// result. tr, if not nil, is the tracker the handlers share (in-process
// workers), for the per-key concurrency and order checks.
func Run(ctx context.Context, c *keylane.Client, cfg Config, tr *Tracker) (Verdict, error) {
	cfg.setDefaults()
	if !cfg.Even && cfg.Skew <= 1 {
		return Verdict{Config: cfg}, fmt.Errorf("sale: zipf skew must be above 1 (got %g); set Even for even demand", cfg.Skew)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	v := Verdict{Config: cfg, MaxPerKey: -1, Final: make([]int64, cfg.SKUs), Demand: make([]int64, cfg.SKUs), Full: make([]int64, cfg.SKUs)}
	sku := func(i int) string { return cfg.Prefix + strconv.Itoa(i) }
	runID := nuid.Next()
	for i := 0; i < cfg.SKUs; i++ {
		// By ID: a set tried again after a timeout is stored once.
		set := []byte("set " + strconv.FormatInt(cfg.Stock, 10))
		if _, err := retry(ctx, func() ([]byte, error) {
			return c.Call(ctx, sku(i), set, keylane.WithID(runID+"-stock-"+strconv.Itoa(i)))
		}); err != nil {
			return v, fmt.Errorf("stock %s: %w", sku(i), err)
		}
	}
	// Decide every purchase's SKU up front so demand is known exactly.
	picks := Picks(cfg.Purchases, cfg.SKUs, cfg.Skew, cfg.Even)
	for _, p := range picks {
		v.Demand[p]++
	}
	start := time.Now()
	var err error
	var lat []time.Duration
	if cfg.FireAndForget {
		err = submitAll(ctx, c, cfg, picks, runID, sku, &v)
	} else {
		lat, err = callAll(ctx, c, cfg, picks, runID, sku, &v)
	}
	if err != nil {
		return v, err
	}
	if cfg.FireAndForget {
		// Wait until the stream is empty: every purchase ran and was
		// acked. Asking for stream info keeps the wait off the hot key's
		// lane, which polling its stock with "get" jobs would load.
		pause := 2 * time.Millisecond
		for {
			n, err := retry(ctx, func() (uint64, error) { return c.Backlog(ctx) })
			if err != nil {
				return v, fmt.Errorf("fire-and-forget sale: every purchase stored; waiting for them to run: %w", err)
			}
			if cfg.Progress != nil {
				cfg.Progress(cfg.Purchases - int(min(n, uint64(cfg.Purchases))))
			}
			if n == 0 {
				break
			}
			// One stream info request per shard each time: back off so the
			// wait does not load the server whose throughput it measures.
			time.Sleep(pause)
			pause = min(2*pause, 50*time.Millisecond)
		}
	}
	v.Elapsed = time.Since(start)
	v.JobsPerS = float64(cfg.Purchases) / v.Elapsed.Seconds()
	if len(lat) > 0 {
		slices.Sort(lat)
		v.P50 = lat[len(lat)/2]
		v.P99 = lat[len(lat)*99/100]
		v.Max = lat[len(lat)-1]
	}
	for i := 0; i < cfg.SKUs; i++ {
		got, err := stock(ctx, c, sku(i))
		if err != nil {
			return v, err
		}
		v.Final[i] = got
	}
	if cfg.FireAndForget {
		for i := range v.Final {
			v.Sold += cfg.Stock - v.Final[i]
		}
		v.Refused = int64(cfg.Purchases) - v.Sold - v.BacklogFull()
	}
	v.judge()
	if tr != nil {
		v.MaxPerKey = tr.MaxConcurrent()
		v.OutOfOrd = tr.OrderViolations()
	}
	return v, nil
}

// Picks returns the SKU of each of n purchases: Zipf-distributed over skus
// SKUs with exponent skew (above 1; SKU 0 the hottest), or spread evenly
// when even is set; all SKU 0 when there is one SKU. The draw depends on n
// alone, so runs of the same size see the same demand, and the bench gives
// every contender the sequence Run uses.
func Picks(n, skus int, skew float64, even bool) []int {
	picks := make([]int, n)
	if skus <= 1 {
		return picks
	}
	r := rand.New(rand.NewPCG(1, uint64(n)))
	if even {
		for i := range picks {
			picks[i] = r.IntN(skus)
		}
		return picks
	}
	zipf := rand.NewZipf(r, skew, 1, uint64(skus-1))
	for i := range picks {
		picks[i] = int(zipf.Uint64())
	}
	return picks
}

func callAll(ctx context.Context, c *keylane.Client, cfg Config, picks []int, runID string, sku func(int) string, v *Verdict) ([]time.Duration, error) {
	lat := make([]time.Duration, len(picks))
	var next atomic.Int64
	var sold, refused, failed, answered atomic.Int64
	full := make([]atomic.Int64, cfg.SKUs)
	soldBy := make([]atomic.Int64, cfg.SKUs)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for b := 0; b < cfg.Buyers; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(picks) || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				res, err := c.Call(ctx, sku(picks[i]), []byte("buy 1"), keylane.WithID(runID+"-"+strconv.Itoa(i)))
				lat[i] = time.Since(t0)
				if cfg.Progress != nil {
					cfg.Progress(int(answered.Add(1)))
				}
				switch {
				case errors.Is(err, keylane.ErrKeyBacklogFull):
					full[picks[i]].Add(1)
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case strings.HasPrefix(string(res), "sold "):
					sold.Add(1)
					soldBy[picks[i]].Add(1)
				case strings.HasPrefix(string(res), "soldout "):
					refused.Add(1)
				default:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Errorf("unexpected result %q", res))
				}
			}
		}()
	}
	wg.Wait()
	v.Sold, v.Refused, v.Failed = sold.Load(), refused.Load(), failed.Load()
	v.SoldBy = make([]int64, len(soldBy))
	for i := range full {
		v.Full[i] = full[i].Load()
		v.SoldBy[i] = soldBy[i].Load()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e, ok := firstErr.Load().(error); ok {
		v.FirstError = e.Error()
	}
	return lat, nil
}

func submitAll(ctx context.Context, c *keylane.Client, cfg Config, picks []int, runID string, sku func(int) string, v *Verdict) error {
	const chunk = 4096
	for lo := 0; lo < len(picks); lo += chunk {
		hi := min(lo+chunk, len(picks))
		reqs := make([]keylane.Request, 0, hi-lo)
		for i := lo; i < hi; i++ {
			reqs = append(reqs, keylane.Request{Key: sku(picks[i]), Payload: []byte("buy 1"), ID: runID + "-" + strconv.Itoa(i)})
		}
		out, err := c.SubmitMany(ctx, reqs)
		if err != nil {
			// ctx ended: the chunk's outcomes are not all known.
			return fmt.Errorf("%s: %w", storedSoFar("at least ", lo, len(picks)), err)
		}
		var first error
		stored := lo
		for j, s := range out {
			switch {
			case s.Err == nil:
				stored++
			case errors.Is(s.Err, keylane.ErrKeyBacklogFull):
				v.Full[picks[lo+j]]++ // refused at admission: part of the verdict
			case first == nil:
				first = fmt.Errorf("submit %s: %w", s.ID, s.Err)
			}
		}
		if first != nil {
			return fmt.Errorf("%s: %w", storedSoFar("", stored, len(picks)), first)
		}
	}
	return nil
}

// storedSoFar says, for an aborted fire-and-forget sale, how many
// purchases were stored: they stay in the stream and will run.
func storedSoFar(bound string, stored, total int) string {
	return fmt.Sprintf("fire-and-forget sale aborted with %s%d of %d purchases stored (those will run; no more were submitted)", bound, stored, total)
}

// retry runs f until it returns no error, an error other than a
// transient one (natserr.IsTransient), or ctx ends. A request that times
// out or finds no responder while a node of the cluster restarts or a
// leader is elected is tried again, with backoff, within the sale's
// deadline, instead of ending the sale: only what is safe to repeat goes
// through it (a read, a job with an ID).
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	pause := 50 * time.Millisecond
	for {
		v, err := f()
		if err == nil || !natserr.IsTransient(err) || ctx.Err() != nil {
			return v, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, fmt.Errorf("%w (tried again until the sale's deadline: %w)", err, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

func stock(ctx context.Context, c *keylane.Client, key string) (int64, error) {
	res, err := retry(ctx, func() ([]byte, error) { return c.Call(ctx, key, []byte("get")) })
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", key, err)
	}
	n, ok := strings.CutPrefix(string(res), "stock ")
	if !ok {
		return 0, errors.New("unexpected reply to get: " + string(res))
	}
	return strconv.ParseInt(n, 10, 64)
}
