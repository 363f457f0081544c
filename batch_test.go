package keylane

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

func groupClient(e *env) *Client {
	e.t.Helper()
	c, err := NewClient(ctx(e.t), natstest.Connect(e.t, e.srv), ClientConfig{AtomicBatches: true})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c
}

// holdBatches makes the batcher queue instead of send, as if its batches
// were all in flight; the returned func sends what queued and lets go.
func holdBatches(c *Client) func() {
	c.batch[0].mu.Lock()
	c.batch[0].inflight = batchInflight
	c.batch[0].mu.Unlock()
	return func() {
		c.batch[0].mu.Lock()
		c.batch[0].inflight = 0
		c.batch[0].sendLocked()
		c.batch[0].mu.Unlock()
	}
}

func queued(c *Client) int {
	c.batch[0].mu.Lock()
	defer c.batch[0].mu.Unlock()
	return len(c.batch[0].queue)
}

// TestAtomicBatchCalls sends concurrent Calls through a batching
// client, held so they queue into one atomic batch: every job is stored
// and applied once, and each caller gets its own result.
func TestAtomicBatchCalls(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	c := groupClient(e)
	cnt := newCounter()
	e.waitOwned(reducerWorker(e, "w1", cnt))
	release := holdBatches(c)
	const calls = 100
	var wg sync.WaitGroup
	results := make([]string, calls)
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Call(ctx(t), "k"+strconv.Itoa(i%3), []byte("inc"), WithID(fmt.Sprintf("g-%d", i)))
			results[i], errs[i] = string(res), err
		}()
	}
	testwait.Eventually(t, 10*time.Second, "calls queued", func() bool { return queued(c) == calls })
	release()
	wg.Wait()
	seen := map[string]bool{}
	for i := range calls {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		r := fmt.Sprintf("k%d %s", i%3, results[i])
		if seen[r] {
			t.Fatalf("result %q given twice", r)
		}
		seen[r] = true
	}
	c.batch[0].mu.Lock()
	sent, resent := c.batch[0].sent, c.batch[0].resent
	c.batch[0].mu.Unlock()
	if sent != 1 || resent != 0 {
		t.Fatalf("batches sent %d, resent %d; want one atomic batch that held", sent, resent)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	if len(cnt.applied) != calls {
		t.Fatalf("%d jobs applied, want %d", len(cnt.applied), calls)
	}
}

// TestAtomicBatchFallsBack puts a job whose ID the stream has already seen
// into a batch. The server refuses the whole atomic batch; the client
// resends its jobs one by one, so every new job is stored once and the
// duplicate is acknowledged without a second copy.
func TestAtomicBatchFallsBack(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	c := groupClient(e)
	if _, err := c.Submit(ctx(t), "k", []byte("inc"), WithID("seen")); err != nil {
		t.Fatal(err)
	}
	release := holdBatches(c)
	const n = 30
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("new-%d", i)
			if i == n/2 {
				id = "seen"
			}
			_, errs[i] = c.Submit(ctx(t), "k"+strconv.Itoa(i), []byte("inc"), WithID(id))
		}()
	}
	testwait.Eventually(t, 10*time.Second, "submits queued", func() bool { return queued(c) == n })
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil && !(i == n/2 && errors.Is(err, ErrDuplicate)) {
			t.Fatal(err)
		}
	}
	if got := e.streamMsgs(e.topo.Names.Jobs()); got != n {
		t.Fatalf("stream holds %d jobs, want %d (29 new, and the duplicate once)", got, n)
	}
	c.batch[0].mu.Lock()
	defer c.batch[0].mu.Unlock()
	if c.batch[0].resent != 1 {
		t.Fatalf("resent %d batches, want the refused one", c.batch[0].resent)
	}
}
