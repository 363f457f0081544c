package keylane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// TestFailingKeyDoesNotStallItsPartition: one key's head job fails and
// retries while that key's backlog is larger than the worker's in-flight
// window. Another key of the same partition must keep flowing (its calls
// answered while the head still fails), and the failing key's jobs must
// still apply in stream order once it recovers.
func TestFailingKeyDoesNotStallItsPartition(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const window, backlog = 64, 400
	var failing atomic.Bool
	failing.Store(true)
	var order []int // the hot key's applied payload numbers, in apply order
	red := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		if job.Key == "hot" {
			n, _ := strconv.Atoi(string(job.Payload))
			if n == 0 && failing.Load() {
				return nil, nil, fmt.Errorf("head of the hot key fails")
			}
			order = append(order, n) // one key runs one job at a time
		}
		return countReducer(ctx, job, cur)
	})
	w := e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer, c.MaxInFlight, c.MaxDeliver = nil, red, window, 1000
		c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	})
	e.waitOwned(w)

	reqs := make([]Request, backlog)
	for i := range reqs {
		reqs[i] = Request{Key: "hot", Payload: []byte(strconv.Itoa(i))}
	}
	e.submitAll(reqs)
	testwait.Eventually(t, 10*time.Second, "the hot key's head retrying", func() bool { return w.Stats().Failed > 3 })
	// By count, not by the clock: the calls are answered while the hot
	// key's head still fails (the deadline is only a net).
	for i := range 5 {
		cctx, cancel := context.WithTimeout(ctx(t), 15*time.Second)
		res, err := e.client.Call(cctx, "other", nil)
		cancel()
		if err != nil || string(res) != strconv.Itoa(i+1) {
			t.Fatalf("another key's call %d while the hot key retries = %q, %v; stats %+v", i, res, err, w.Stats())
		}
	}
	if s := w.Stats(); s.DeadLettered != 0 || len(order) != 0 {
		t.Fatalf("the hot key's head settled during the calls (dead-lettered %d, applied %d)", s.DeadLettered, len(order))
	}
	failing.Store(false)
	testwait.Eventually(t, 30*time.Second, "the hot key's backlog applied", func() bool {
		got, _ := NewState(e.topo.State).Get(ctx(t), "hot")
		return string(got.Value) == strconv.Itoa(backlog)
	})
	if !slices.IsSorted(order) || len(order) != backlog {
		t.Fatalf("hot key applied %d jobs, in order %v", len(order), slices.IsSorted(order))
	}
	t.Logf("stats %+v", w.Stats())
}

// TestFailingKeyDoesNotHoldASmallWindow is TestFailingKeyDoesNotStallItsPartition
// on in-flight windows down to the smallest the worker accepts: the hot
// key's head fails on every attempt while another key of the partition
// is called. Every call must be answered while the head still fails (it
// is never dead-lettered here), whatever MaxInFlight is: a stalled key
// keeps at most half the window and its retrying head does not count, so
// the window always has room for other keys. The hot key's backlog stays
// within the server's window (MaxPending − MaxInFlight hand-backs), the
// documented bound past which the server itself delivers nothing new.
// The pass/fail is by count, not by the clock: each call's deadline is
// only a net for a stalled partition, which on main answered none.
func TestFailingKeyDoesNotHoldASmallWindow(t *testing.T) {
	for _, tc := range []struct{ window, runners int }{{1, 8}, {2, 8}, {16, 8}, {17, 8}, {16, 1}, {1, 1}} {
		window := tc.window
		t.Run(fmt.Sprintf("MaxInFlight=%d,Concurrency=%d", window, tc.runners), func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1})
			const backlog, calls = 40, 5
			var failing atomic.Bool
			failing.Store(true)
			var order []int
			red := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
				if job.Key == "hot" {
					n, _ := strconv.Atoi(string(job.Payload))
					if n == 0 && failing.Load() {
						return nil, nil, fmt.Errorf("head of the hot key fails")
					}
					order = append(order, n)
				}
				return countReducer(ctx, job, cur)
			})
			w := e.worker("w", nil, func(c *WorkerConfig) {
				c.Handler, c.Reducer = nil, red
				c.MaxInFlight, c.MaxPending, c.MaxDeliver, c.Concurrency = window, window+2*backlog, 1_000_000, tc.runners
				c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
			})
			e.waitOwned(w)
			reqs := make([]Request, backlog)
			for i := range reqs {
				reqs[i] = Request{Key: "hot", Payload: []byte(strconv.Itoa(i))}
			}
			e.submitAll(reqs)
			testwait.Eventually(t, 10*time.Second, "the hot key's head retrying", func() bool { return w.Stats().Failed > 3 })
			for i := range calls {
				cctx, cancel := context.WithTimeout(ctx(t), 15*time.Second)
				res, err := e.client.Call(cctx, "other", nil)
				cancel()
				if err != nil || string(res) != strconv.Itoa(i+1) {
					t.Fatalf("another key's call %d while the hot key's head fails = %q, %v; stats %+v, tenures %+v", i, res, err, w.Stats(), w.Tenures())
				}
			}
			if s := w.Stats(); s.DeadLettered != 0 || len(order) != 0 {
				t.Fatalf("the hot key's head settled during the calls (dead-lettered %d, applied %d): the calls proved nothing", s.DeadLettered, len(order))
			}
			failing.Store(false)
			testwait.Eventually(t, 30*time.Second, "the hot key's backlog applied", func() bool {
				got, _ := NewState(e.topo.State).Get(ctx(t), "hot")
				return string(got.Value) == strconv.Itoa(backlog)
			})
			if !slices.IsSorted(order) || len(order) != backlog {
				t.Fatalf("hot key applied %d jobs, in order %v", len(order), slices.IsSorted(order))
			}
			t.Logf("stats %+v", w.Stats())
		})
	}
}

// TestHotKeyLeavesHandBackMode: 64 callers keep calling one key while
// one of its jobs fails for a while (until the test says so, not for a
// time), which makes the key hand its queued and arriving jobs back.
// Once that job succeeds the key must return to normal running while its
// traffic keeps arriving: the jobs it handed back are taken as they come
// back, whatever their order, and no new job is handed back. The test
// asserts the mechanism: after the failure ends, the worker's hand-back
// counter stops moving across a stretch of completed calls, and no job of
// the key is left handed back. Throughput before and after is only
// logged (go test -run TestHotKeyLeavesHandBackMode -v). On main every
// new job of the key was handed back while any was, and the returning
// ones were taken only when lowest: the counter never stopped.
//
// Each caller has a client of its own, calling one job at a time: its
// every job is a batch of one, which is handed back whole. A job of a
// batch of several is never handed back (a message cannot be half-NAKed):
// TestStalledKeyOfBatchJobsDoesNotHoldTheWindow covers a stalled key of
// such jobs.
func TestHotKeyLeavesHandBackMode(t *testing.T) {
	t.Run("reducer", func(t *testing.T) { hotKeyLeavesHandBackMode(t, true) })
	t.Run("handler", func(t *testing.T) { hotKeyLeavesHandBackMode(t, false) })
}

func hotKeyLeavesHandBackMode(t *testing.T, reducer bool) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const callers = 64
	var (
		mu        sync.Mutex
		armed     bool   // the next job to run becomes the victim
		victim    string // the job that fails until recovered is closed
		runs      = map[string]int{}
		recovered = make(chan struct{})
	)
	// fails counts j's run and says whether it fails.
	fails := func(j Job) bool {
		mu.Lock()
		defer mu.Unlock()
		runs[j.ID]++
		if armed {
			armed, victim = false, j.ID
		}
		if j.ID != victim {
			return false
		}
		select {
		case <-recovered:
			return false
		default:
			return true
		}
	}
	errVictim := errors.New("the victim fails until the test recovers it")
	w := e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler = HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
			if fails(j) {
				return nil, errVictim
			}
			return nil, nil
		})
		if reducer {
			c.Handler, c.Reducer = nil, ReducerFunc(func(ctx context.Context, j Job, cur []byte) ([]byte, []byte, error) {
				if fails(j) {
					return nil, nil, errVictim
				}
				return countReducer(ctx, j, cur)
			})
		}
		c.MaxDeliver = 1_000_000
		c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
	})
	e.waitOwned(w)
	callerConn := natstest.Connect(t, e.srv)
	clients := make([]*Client, callers)
	for i := range clients {
		c, err := NewClient(ctx(t), callerConn, ClientConfig{Namespace: e.ns})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}

	var done atomic.Int64 // calls answered
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		caller := clients[i]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := caller.Call(cctx, "hot", nil)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	// rate measures calls/s over the next n answered calls.
	rate := func(n int64) float64 {
		from, start := done.Load(), time.Now()
		testwait.Eventually(t, 60*time.Second, fmt.Sprintf("%d more calls answered", n), func() bool { return done.Load() >= from+n })
		return float64(done.Load()-from) / time.Since(start).Seconds()
	}
	before := rate(2000)

	mu.Lock()
	armed = true
	mu.Unlock()
	testwait.Eventually(t, 20*time.Second, "the victim retrying and the key handing jobs back", func() bool {
		s := w.Stats()
		return s.Failed >= 5 && s.HandedBack >= 4*callers
	})
	close(recovered)
	backDuring := w.Stats().HandedBack

	// The exit: hand-backs stop while the calls go on. A stretch of 1000
	// answered calls with no hand-back means the key runs normally; on
	// main the counter moved with every call.
	var lastBack, since int64 = -1, 0
	testwait.Eventually(t, 30*time.Second, "1000 calls answered with no job handed back", func() bool {
		if b := w.Stats().HandedBack; b != lastBack {
			lastBack, since = b, done.Load()
			return false
		}
		return done.Load() >= since+1000
	})
	for _, tn := range w.Tenures() {
		if tn.HandedBack != 0 {
			t.Fatalf("partition %d still has %d jobs handed back", tn.Partition, tn.HandedBack)
		}
	}
	after := rate(2000)
	if b := w.Stats().HandedBack; b != lastBack {
		t.Fatalf("%d more jobs handed back after the key recovered", b-lastBack)
	}
	select {
	case err := <-errs:
		t.Fatalf("a call failed: %v", err)
	default:
	}
	mu.Lock()
	for id, n := range runs {
		if id != victim && n != 1 {
			t.Errorf("job %s ran %d times", id, n)
		}
	}
	mu.Unlock()
	t.Logf("calls/s with %d callers on one key (reducer %v): %.0f before the failure, %.0f after it; %d jobs handed back during it, %d in all",
		callers, reducer, before, after, backDuring, lastBack)
}

// TestWorkerConfigNeedsRoomBeyondTheWindow: the server's window holds a
// failing key's retrying head and its hand-backs beyond the in-flight
// window, so a MaxPending that does not exceed MaxInFlight, where that key
// could hold its partition, is refused; the smallest windows the worker
// accepts are those TestFailingKeyDoesNotHoldASmallWindow runs.
func TestWorkerConfigNeedsRoomBeyondTheWindow(t *testing.T) {
	for _, tc := range []struct {
		inFlight, pending int
		ok                bool
	}{{1, 1, false}, {4, 4, false}, {4, 3, false}, {1, 2, true}, {1, 0, true}, {1024, 0, true}} {
		c := WorkerConfig{Handler: echo(), MaxInFlight: tc.inFlight, MaxPending: tc.pending}
		if err := c.setDefaults(); (err == nil) != tc.ok {
			t.Errorf("MaxInFlight %d, MaxPending %d: %v; want accepted %v", tc.inFlight, tc.pending, err, tc.ok)
		}
	}
}

// TestStalledKeysDoNotFillTheWindow: several keys of one partition fail
// at once (until the test releases them, as keys held for ErrEpoch after
// a re-created jobs stream are), each with a backlog larger than what a
// stalled key keeps. Each kept min(16, MaxInFlight/2) queued jobs and
// nothing took them back, so two or three stalled keys filled the window
// and no other key was fetched. Another key's calls must be answered
// while they all still fail, and each failing key's jobs must apply in
// stream order once released. By count: each call's deadline is only a
// net for a partition that stopped.
func TestStalledKeysDoNotFillTheWindow(t *testing.T) {
	for _, window := range []int{16, 32} {
		t.Run(fmt.Sprintf("MaxInFlight=%d", window), func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1})
			const failingKeys, backlog, calls = 4, 24, 5
			var failing atomic.Bool
			failing.Store(true)
			var mu sync.Mutex
			order := map[string][]int{} // each failing key's applied payload numbers
			failed := map[string]bool{}
			red := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
				if job.Key != "other" {
					n, _ := strconv.Atoi(string(job.Payload))
					mu.Lock()
					defer mu.Unlock()
					if n == 0 && failing.Load() {
						failed[job.Key] = true
						return nil, nil, fmt.Errorf("head of %s fails until released", job.Key)
					}
					order[job.Key] = append(order[job.Key], n)
				}
				return countReducer(ctx, job, cur)
			})
			w := e.worker("w", nil, func(c *WorkerConfig) {
				c.Handler, c.Reducer = nil, red
				c.MaxInFlight, c.MaxPending, c.MaxDeliver, c.Concurrency = window, window+4*failingKeys*backlog, 1_000_000, 2
				c.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
			})
			e.waitOwned(w)
			var reqs []Request
			for k := range failingKeys {
				for i := range backlog {
					reqs = append(reqs, Request{Key: fmt.Sprintf("failing-%d", k), Payload: []byte(strconv.Itoa(i))})
				}
			}
			e.submitAll(reqs)
			testwait.Eventually(t, 10*time.Second, "two failing keys' heads retrying", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(failed) >= 2 && w.Stats().Failed > 6
			})
			for i := range calls {
				cctx, cancel := context.WithTimeout(ctx(t), 15*time.Second)
				res, err := e.client.Call(cctx, "other", nil)
				cancel()
				if err != nil || string(res) != strconv.Itoa(i+1) {
					mu.Lock()
					nf := len(failed)
					mu.Unlock()
					t.Fatalf("another key's call %d while %d keys fail = %q, %v; stats %+v, tenures %+v", i, nf, res, err, w.Stats(), w.Tenures())
				}
			}
			mu.Lock()
			applied := len(order)
			mu.Unlock()
			if s := w.Stats(); s.DeadLettered != 0 || applied != 0 {
				t.Fatalf("a failing key's head settled during the calls (dead-lettered %d, keys applied %d): the calls proved nothing", s.DeadLettered, applied)
			}
			failing.Store(false)
			for k := range failingKeys {
				key := fmt.Sprintf("failing-%d", k)
				testwait.Eventually(t, 30*time.Second, key+"'s backlog applied", func() bool {
					got, _ := NewState(e.topo.State).Get(ctx(t), key)
					return string(got.Value) == strconv.Itoa(backlog)
				})
				mu.Lock()
				o := slices.Clone(order[key])
				mu.Unlock()
				if !slices.IsSorted(o) || len(o) != backlog {
					t.Fatalf("%s applied %d jobs, in order %v", key, len(o), slices.IsSorted(o))
				}
			}
			t.Logf("stats %+v", w.Stats())
		})
	}
}

// TestRetriesStayWithinConcurrency: keys whose head jobs fail a few times
// each, with Concurrency 2. A runner waiting out a backoff lets a spare
// one run other keys, but the handler must never run more than
// Concurrency jobs at once: each paused runner coming back must wait for
// a free place. Before, every pause started a spare that took another
// failing key, and all their heads came back from the same backoff
// together, calling the handler at once.
func TestRetriesStayWithinConcurrency(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const runners, keys, fails = 2, 8, 3
	var (
		mu       sync.Mutex
		cur, top int
		tries    = map[string]int{}
	)
	w := e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		mu.Lock()
		cur++
		top = max(top, cur)
		tries[j.Key]++
		n := tries[j.Key]
		mu.Unlock()
		// Hold the call a little so that calls made together overlap; the
		// pass/fail is the count, not this time.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		cur--
		mu.Unlock()
		if n <= fails {
			return nil, fmt.Errorf("%s fails %d times", j.Key, fails)
		}
		return nil, nil
	}), func(c *WorkerConfig) {
		c.Concurrency, c.MaxDeliver = runners, 1_000_000
		c.Backoff = func(int) time.Duration { return 100 * time.Millisecond }
	})
	e.waitOwned(w)
	var reqs []Request
	for k := range keys {
		reqs = append(reqs, Request{Key: fmt.Sprintf("k%d", k)})
	}
	e.submitAll(reqs)
	testwait.Eventually(t, 60*time.Second, "every key's job done", func() bool { return w.Stats().Succeeded == keys })
	mu.Lock()
	defer mu.Unlock()
	if top > runners {
		t.Fatalf("the handler ran %d jobs at once with Concurrency %d", top, runners)
	}
	for k, n := range tries {
		if n != fails+1 {
			t.Errorf("%s tried %d times, want %d", k, n, fails+1)
		}
	}
}
