package keylane

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
)

// TestSubmitBatchesAPartitionsConcurrentJobs: with ClientConfig.Batches,
// concurrent Submits to one partition travel as batch messages (seen on
// the wire), every job runs once with its own key, payload and headers,
// and every batch message is acked.
func TestSubmitBatchesAPartitionsConcurrentJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var mu sync.Mutex
	ran := map[string]int{}
	bad := 0
	e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[j.ID]++
		if j.Headers.Get("X-Buyer") != string(j.Payload) || !strings.HasPrefix(j.Key, "seat:") {
			bad++
		}
		return nil, nil
	}), func(c *WorkerConfig) { c.Batches = true })
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns, Batches: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const buyers, each = 64, 20
	ids := make(chan string, buyers*each)
	var wg sync.WaitGroup
	for b := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				who := itoa(uint64(b*each + i))
				id, err := c.Submit(ctx(t), "seat:"+itoa(uint64(i%7)), []byte(who), WithHeader("X-Buyer", who))
				if err != nil {
					t.Error(err)
					return
				}
				ids <- id
			}
		}()
	}
	wg.Wait()
	close(ids)
	testwait.Eventually(t, 30*time.Second, "every job run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == buyers*each
	})
	testwait.Eventually(t, 10*time.Second, "every message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for id := range ids {
		if ran[id] != 1 {
			t.Fatalf("job %s ran %d times", id, ran[id])
		}
	}
	if bad > 0 {
		t.Fatalf("%d jobs ran with another key, payload or header than submitted", bad)
	}
	if n, _, _ := batches.Pending(); n == 0 {
		t.Fatal("no batch message was sent (64 concurrent submitters of one partition)")
	} else {
		t.Logf("%d jobs in %d batch messages and the rest alone", buyers*each, n)
	}
}

// TestSubmitManyInBatches: with ClientConfig.Batches, SubmitMany cuts a
// partition's jobs into batch messages of at most 256, sends a job with a
// caller's ID alone between them, and every key's jobs still run once
// each, in the order given.
func TestSubmitManyInBatches(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var mu sync.Mutex
	order := map[string][]string{}
	e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		order[j.Key] = append(order[j.Key], string(j.Payload))
		mu.Unlock()
		return nil, nil
	}), func(c *WorkerConfig) { c.Batches = true })
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns, Batches: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const jobs = 600
	var reqs []Request
	want := map[string][]string{}
	for i := range jobs {
		key, payload := "seat:"+itoa(uint64(i%5)), itoa(uint64(i))
		r := Request{Key: key, Payload: []byte(payload)}
		if i == 399 {
			r.ID = "own-" + payload // goes alone, in its place
		}
		reqs = append(reqs, r)
		want[key] = append(want[key], payload)
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	testwait.Eventually(t, 30*time.Second, "every message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for key, w := range want {
		if !slices.Equal(order[key], w) {
			t.Fatalf("key %s ran %v, want %v", key, order[key], w)
		}
	}
	// The job with an ID cuts the others into runs of 399 and 200, and a
	// batch holds at most 256: 3 batch messages.
	if n, _, _ := batches.Pending(); n != 3 {
		t.Fatalf("%d batch messages, want 3", n)
	}
}
