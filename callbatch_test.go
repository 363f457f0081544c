package keylane

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// batchCalls makes one Call per payload concurrently on keys[i%len(keys)]
// and returns each one's result and error, in payload order.
func batchCalls(t *testing.T, c *Client, keys []string, payloads []string) ([]string, []error) {
	t.Helper()
	res, errs := make([]string, len(payloads)), make([]error, len(payloads))
	var wg sync.WaitGroup
	for i, p := range payloads {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			r, err := c.Call(cctx, keys[i%len(keys)], []byte(p))
			res[i], errs[i] = string(r), err
		})
	}
	wg.Wait()
	return res, errs
}

// TestCallsTravelInBatches: with ClientConfig.Batches, 64 concurrent
// Calls without a caller's ID on one key, then on 64 keys, travel in
// batch messages (seen on the wire), every job is applied once, and every
// Call gets its own job's result.
func TestCallsTravelInBatches(t *testing.T) {
	for _, keys := range []int{1, 64} {
		t.Run(strconv.Itoa(keys)+" keys", func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1})
			r := newCounter()
			e.waitOwned(batchWorker(e, "w", r))
			batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var ks, ps []string
			for i := range keys {
				ks = append(ks, "seat:"+strconv.Itoa(i))
			}
			for i := range 64 {
				ps = append(ps, strconv.Itoa(i))
			}
			res, errs := batchCalls(t, c, ks, ps)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			// One key: the counts 1..64, one each; 64 keys: 1 each.
			var want []string
			for i := range 64 {
				if keys == 1 {
					want = append(want, "n="+strconv.Itoa(i+1))
				} else {
					want = append(want, "n=1")
				}
			}
			got := slices.Clone(res)
			slices.SortFunc(got, func(a, b string) int { x, _ := strconv.Atoi(a[2:]); y, _ := strconv.Atoi(b[2:]); return x - y })
			if !slices.Equal(got, want) {
				t.Fatalf("results %v, want %v: a Call got another's result or none", got, want)
			}
			r.mu.Lock()
			applied := copyCounts(r.applied)
			r.mu.Unlock()
			if len(applied) != 64 {
				t.Fatalf("%d jobs applied, want 64", len(applied))
			}
			for id, n := range applied {
				if n != 1 {
					t.Fatalf("job %s applied %d times", id, n)
				}
			}
			if n, _, _ := batches.Pending(); n == 0 {
				t.Fatal("no batch message was sent (64 concurrent Calls of one partition)")
			} else {
				t.Logf("64 Calls in %d batch messages and the rest alone", n)
			}
		})
	}
}

// queueBehindALostPublish makes a Call of lead whose publish the proxy
// swallows, so its partition has a send in flight, then starts a Call per
// payload and waits until they all queue behind it: they go as one batch
// when the lead's publish returns. done gets every Call's outcome.
type callOutcome struct {
	payload, res string
	err          error
}

func queueBehindALostPublish(t *testing.T, c *Client, nc *nats.Conn, p *faultproxy.Proxy, key string, payloads []string) (chan callOutcome, *faultproxy.Toxic) {
	t.Helper()
	swallow, err := p.Timeout(faultproxy.Upstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan callOutcome, len(payloads)+1)
	call := func(payload string) {
		cctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		r, err := c.Call(cctx, key, []byte(payload))
		done <- callOutcome{payload, string(r), err}
	}
	sent := nc.Stats().OutMsgs
	go call("lead")
	testwait.Eventually(t, 5*time.Second, "the lead's publish sent (and swallowed)", func() bool { return nc.Stats().OutMsgs > sent })
	for _, pl := range payloads {
		go call(pl)
	}
	testwait.Eventually(t, 5*time.Second, "every Call queued behind the lead", func() bool { return c.e.Queued(0) == len(payloads) })
	return done, swallow
}

// isLeadBatch reports whether m, a batch message, is the lead's of
// queueBehindALostPublish: a batch of one (every job goes in a batch
// message), its one job's payload "lead".
func isLeadBatch(m *nats.Msg) bool {
	jobs, err := wire.DecodeBatch(m.Data)
	return err == nil && len(jobs) == 1 && string(jobs[0].Payload) == "lead"
}

// nextQueuedBatch returns the next batch message on sub that is not the
// lead's batch of one (isLeadBatch): the batch of the Calls that queued
// behind it.
func nextQueuedBatch(t *testing.T, sub *nats.Subscription) (*nats.Msg, error) {
	t.Helper()
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil || !isLeadBatch(m) {
			return m, err
		}
	}
}

// leadAndQueued splits the batch entries left by Calls made with
// queueBehindALostPublish into the lead's (a batch of one: it went
// alone, ahead of the others) and the one batch of the queued Calls,
// whose outcomes it returns. It fails the test unless there are exactly
// these two entries, the queued batch's keeping queued outcomes.
func leadAndQueued(t *testing.T, batches map[string][]wire.BatchOutcome, queued int) (lead wire.BatchOutcome, batchID string, outs []wire.BatchOutcome) {
	t.Helper()
	var leads int
	for id, o := range batches {
		switch len(o) {
		case 1:
			leads++
			lead = o[0]
		case queued:
			batchID, outs = id, o
		}
	}
	if len(batches) != 2 || leads != 1 || outs == nil || queued < 2 {
		t.Fatalf("batch entries %v, want the lead's batch of one and one batch of the %d queued Calls", batches, queued)
	}
	return lead, batchID, outs
}

// TestBatchedCallOfADeadLetteredJob: a batch of Calls of one key where
// one job is poisoned: that job is dead-lettered alone and its Call gets
// a *RemoteError; every other Call gets its own job's result, each job
// applied once.
func TestBatchedCallOfADeadLetteredJob(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	r.poisoned = "poison"
	e.waitOwned(batchWorker(e, "w", r))
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	payloads := []string{"a", "b", "poison", "c", "d"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	var results []string
	for range len(payloads) + 1 {
		var o callOutcome
		select {
		case o = <-done:
		case <-time.After(40 * time.Second):
			t.Fatal("a Call never returned")
		}
		var remote *RemoteError
		switch {
		case o.payload == "poison":
			if !errors.As(o.err, &remote) {
				t.Fatalf("the poisoned job's Call = %q, %v; want a *RemoteError", o.res, o.err)
			}
		case o.err != nil:
			t.Fatalf("call %s: %v", o.payload, o.err)
		default:
			results = append(results, o.res)
		}
	}
	slices.Sort(results)
	if want := []string{"n=1", "n=2", "n=3", "n=4", "n=5"}; !slices.Equal(results, want) {
		t.Fatalf("results %v, want %v", results, want)
	}
	m, err := nextQueuedBatch(t, batches) // (the lead went alone, a batch of one)
	if err != nil {
		t.Fatalf("no batch message of the queued Calls on the wire: %v", err)
	}
	jobs, err := wire.DecodeBatch(m.Data)
	if err != nil || len(jobs) != len(payloads) {
		t.Fatalf("batch of %d jobs (%v), want the %d queued Calls", len(jobs), err, len(payloads))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) != len(payloads) {
		t.Fatalf("%d jobs applied, want %d (the poisoned one not)", len(r.applied), len(payloads))
	}
	for id, n := range r.applied {
		if n != 1 {
			t.Fatalf("job %s applied %d times", id, n)
		}
	}
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
}

// TestBatchedCallWhoseBatchAckIsLost: a batch of Calls is stored but its
// stream ack, and the replies, are lost on the way to the client. The
// client publishes the batch again whole, under its batch ID (seen twice
// on the wire), the server drops the copy, every job is applied once, and
// each Call gets its own result from the outcome kept for its job, found
// by the job's ID. (The lead ahead of the batch, a batch of one, was
// stored and answered before the ack was lost.)
// (Were the copy stored, under a new ID, the Reducer's held outcomes, the
// state entry's recent job IDs, would still keep its jobs from being
// applied again: the stream's count is what shows the copy dropped.)
func TestBatchedCallWhoseBatchAckIsLost(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	e.waitOwned(batchWorker(e, "w", r))
	batches, err := e.nc.SubscribeSync(wire.BatchSubject(e.ns, 0))
	if err != nil {
		t.Fatal(err)
	}
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	var lost *faultproxy.Toxic
	c.e.SetBeforeBatch(func(*nats.Msg) {
		if lost == nil {
			var err error
			if lost, err = p.Timeout(faultproxy.Downstream, 0); err != nil {
				t.Error(err)
			}
		}
	})
	payloads := []string{"a", "b", "c", "d", "e", "f", "g"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	testwait.Eventually(t, 20*time.Second, "every job applied (the batch's ack lost)", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.applied) == len(payloads)+1
	})
	first, err := nextQueuedBatch(t, batches) // (the lead went alone, a batch of one, before the ack was lost)
	if err != nil {
		t.Fatal(err)
	}
	lost.Remove()
	var results []string
	for range len(payloads) + 1 {
		select {
		case o := <-done:
			if o.err != nil {
				t.Fatalf("call %s: %v", o.payload, o.err)
			}
			results = append(results, o.res)
		case <-time.After(40 * time.Second):
			t.Fatal("a Call never returned")
		}
	}
	again, err := nextQueuedBatch(t, batches)
	if err != nil {
		t.Fatal("the batch was never published again")
	}
	if id := first.Header.Get(HeaderJobID); again.Header.Get(HeaderJobID) != id || string(again.Data) != string(first.Data) {
		t.Fatalf("published again as %q, first as %q: not the same batch", again.Header.Get(HeaderJobID), id)
	}
	testwait.Eventually(t, 10*time.Second, "every stored message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	slices.SortFunc(results, func(a, b string) int { x, _ := strconv.Atoi(a[2:]); y, _ := strconv.Atoi(b[2:]); return x - y })
	if want := []string{"n=1", "n=2", "n=3", "n=4", "n=5", "n=6", "n=7", "n=8"}; !slices.Equal(results, want) {
		t.Fatalf("results %v, want %v", results, want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, n := range r.applied {
		if n != 1 {
			t.Fatalf("job %s applied %d times", id, n)
		}
	}
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx(t)); err != nil || info.State.LastSeq != 2 {
		t.Fatalf("stream state %+v (%v): want 2 messages ever stored, the lead and the batch once", info.State, err)
	}
	if v := e.stateOf("seat:a"); v != "8" {
		t.Fatalf("state %q, want 8", v)
	}
}

// TestBatchedCallRecoversALostReply: the worker answers a batch of Calls
// while the callers' connection is down. Each Call gets its own result
// once the connection is back, from the outcome the worker kept by its
// job's ID (the batch body's keep-outcome flag), not at its deadline.
func TestBatchedCallRecoversALostReply(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	r := newCounter()
	gated := ReducerFunc(func(ctx context.Context, job Job, cur []byte) ([]byte, []byte, error) {
		if string(job.Payload) != "lead" {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
		}
		return r.Reduce(ctx, job, cur)
	})
	w := batchWorker(e, "w", gated)
	e.waitOwned(w)
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	payloads := []string{"a", "b", "c", "d"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker never ran the batch")
	}
	p.Cut()
	close(release)
	testwait.Eventually(t, 10*time.Second, "every job finished and answered into the void", func() bool {
		return w.Stats().Succeeded == int64(len(payloads)+1)
	})
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	var results []string
	for range len(payloads) + 1 {
		select {
		case o := <-done:
			if o.err != nil {
				t.Fatalf("call %s: %v", o.payload, o.err)
			}
			results = append(results, o.res)
		case <-time.After(15 * time.Second):
			t.Fatal("a Call never recovered the reply it lost")
		}
	}
	slices.Sort(results)
	if want := []string{"n=1", "n=2", "n=3", "n=4", "n=5"}; !slices.Equal(results, want) {
		t.Fatalf("results %v, want %v", results, want)
	}
}

// TestBatchedCallWhoseContextEndsWhileQueued: a Call queued behind its
// partition's send in flight whose context ends returns a *NoReplyError
// (ErrNoReply and the context's error, as Call promises), and its job is
// never sent: only the lead is applied.
func TestBatchedCallWhoseContextEndsWhileQueued(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	e.waitOwned(batchWorker(e, "w", r))
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", nil)
	cctx, cancel := context.WithCancel(context.Background())
	quit := make(chan error, 1)
	go func() {
		_, err := c.Call(cctx, "seat:a", []byte("quitter"))
		quit <- err
	}()
	testwait.Eventually(t, 5*time.Second, "the Call queued", func() bool { return c.e.Queued(0) == 1 })
	cancel()
	select {
	case err := <-quit:
		var noReply *NoReplyError
		if !errors.As(err, &noReply) || !errors.Is(err, ErrNoReply) || !errors.Is(err, context.Canceled) {
			t.Fatalf("call = %v; want a *NoReplyError with context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Call outlived its context")
	}
	swallow.Remove()
	select {
	case o := <-done:
		if o.err != nil || o.res != "n=1" {
			t.Fatalf("lead = %q, %v; want n=1", o.res, o.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lead never returned")
	}
	testwait.Eventually(t, 10*time.Second, "every stored message acked", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) != 1 {
		t.Fatalf("%d jobs applied, want only the lead's", len(r.applied))
	}
}
