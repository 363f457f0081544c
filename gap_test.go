package keylane

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// countReducer is a Reducer that counts a key's jobs and answers each with the
// count after it.
var countReducer = ReducerFunc(func(_ context.Context, _ Job, cur []byte) ([]byte, []byte, error) {
	n, _ := strconv.Atoi(string(cur))
	v := []byte(strconv.Itoa(n + 1))
	return v, v, nil
})

// TestStrayPullerLosesNoJob: something else pulls once from the
// partition's consumer (a deposed owner's iterator, an operator's tool)
// and never acks. The owner sees the gap in the delivery sequence and
// re-synchronises; the stray job runs in order, and its caller gets its
// own result, never an empty success.
func TestStrayPullerLosesNoJob(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer, c.AckWait = nil, countReducer, time.Second })
	e.waitOwned(w)

	const callers, each = 8, 60
	key := "seat:A7"
	results := make(chan string, callers*each)
	errs := make(chan error, callers*each)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if i == each/2 {
					<-stop // the second half waits until the stray has its job
				}
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				res, err := e.client.Call(cctx, key, nil, WithID(fmt.Sprintf("c%d-%d", c, i)))
				cancel()
				if err != nil {
					errs <- err
					continue
				}
				results <- string(res)
			}
		}()
	}

	// The stray: pull until it holds one job, never ack it.
	// The owner makes the consumer just after it takes the partition.
	var cons jetstream.Consumer
	testwait.Eventually(t, 10*time.Second, "the partition's consumer exists", func() bool {
		var err error
		cons, err = e.js.Consumer(ctx(t), e.topo.Names.Jobs(), e.topo.Names.Consumer(0))
		return err == nil
	})
	deadline := time.Now().Add(20 * time.Second)
	var stray jetstream.Msg
	for stray == nil && time.Now().Before(deadline) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			continue
		}
		for m := range batch.Messages() {
			stray = m
		}
	}
	close(stop)
	if stray == nil {
		t.Fatal("the stray puller never got a job")
	}
	meta, _ := stray.Metadata()
	t.Logf("stray puller holds stream seq %d", meta.Sequence.Stream)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Errorf("call: %v", err)
	}
	seen := map[int]bool{}
	for r := range results {
		n, err := strconv.Atoi(r)
		if err != nil || n < 1 || n > callers*each || seen[n] {
			t.Errorf("result %q: want a distinct count in 1..%d (an empty result is a silent success)", r, callers*each)
			continue
		}
		seen[n] = true
	}
	got, err := NewState(e.topo.State).Get(ctx(t), key)
	if err != nil || string(got.Value) != strconv.Itoa(callers*each) {
		t.Fatalf("final count %q, %v; want %d", got.Value, err, callers*each)
	}
	t.Logf("stats %+v", w.Stats())
}
