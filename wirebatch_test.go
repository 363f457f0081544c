package keylane

import (
	"context"
	"slices"
	"strconv"
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
	}), nil)
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
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
	}), nil)
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
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

// TestBatchesOnStreamShards: with three jobs streams, a batch of a
// partition is stored in its partition's shard (its subject is inside
// that shard's filter, and the client's expected-stream header names
// it), every job runs once in its key's order, and every shard ends
// empty. Each batch's job IDs are its batch's (sealed), as the worker
// requires.
func TestBatchesOnStreamShards(t *testing.T) {
	const n, s = 6, 3
	e := newEnv(t, TopologyConfig{Partitions: n, StreamShards: s})
	var mu sync.Mutex
	got := map[string][]int{}
	ids := map[string]int{}
	e.worker("w", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		i, _ := strconv.Atoi(string(j.Payload))
		got[j.Key] = append(got[j.Key], i)
		ids[j.ID]++
		return nil, nil
	}), nil)
	batches, err := e.nc.SubscribeSync(e.ns + ".jobs.*." + wire.BatchToken)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns, StreamShards: s})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var keys []string
	for p := range n {
		keys = append(keys, keyIn(p, n, "shard-seat-"))
	}
	const per = 40
	var reqs []Request
	for i := range per {
		for _, k := range keys {
			reqs = append(reqs, Request{Key: k, Payload: []byte(strconv.Itoa(i))})
		}
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
	testwait.Eventually(t, 30*time.Second, "every job run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ids) == len(reqs)
	})
	for i := range s {
		name := e.topo.Names.JobsShard(i)
		testwait.Eventually(t, 10*time.Second, name+" empty", func() bool { return e.streamMsgs(name) == 0 })
	}
	mu.Lock()
	defer mu.Unlock()
	for _, o := range out {
		if ids[o.ID] != 1 {
			t.Fatalf("job %s ran %d times", o.ID, ids[o.ID])
		}
	}
	for _, k := range keys {
		if len(got[k]) != per || !slices.IsSorted(got[k]) {
			t.Fatalf("key %s ran %v, want 0..%d in order", k, got[k], per-1)
		}
	}
	sealed := 0
	for _, o := range out {
		if _, _, ok := wire.ParseBatchedJobID(o.ID); ok {
			sealed++
		}
	}
	if m, _, _ := batches.Pending(); m == 0 || sealed == 0 {
		t.Fatalf("%d batch messages, %d jobs with a batch's ID: no batch travelled", m, sealed)
	}
}
