package keylane

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestInspectJobInItsBatchEntry: a batched Call's outcome, kept only in
// its batch's entry (a Reducer, no StoreResults), is found there by its
// ID, as Client.Result finds it.
func TestInspectJobInItsBatchEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := tagger{newCounter()}
	w := batchWorker(e, "w", r)
	e.waitOwned(w)
	c, nc, p := e.proxiedClientWith(ClientConfig{})
	payloads := []string{"a", "b", "c"}
	done, swallow := queueBehindALostPublish(t, c, nc, p, "seat:a", payloads)
	swallow.Remove()
	checkOwnResults(t, done, payloads)
	testwait.Eventually(t, 10*time.Second, "the batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	_, batches := e.resultsKeys()
	leadAndQueued(t, batches, len(payloads)) // the lead's batch of one, and the queued Calls'
	for _, outs := range batches {
		for _, o := range outs {
			kept, _, _ := decodeResult(o.Value)
			f, err := InspectJob(ctx(t), e.js, e.ns, o.ID, "")
			if err != nil || f.Where != FoundBatch || string(f.Result) != string(kept) || f.Err != nil {
				t.Fatalf("InspectJob(%s) = %+v, %v; want %q from its batch's entry", o.ID, f, err, kept)
			}
		}
	}
}

// TestInspectJobReadsEveryDeadLetter: a dead-lettered job without an ID
// of its caller's (no kept outcome) is found in the dead-letter stream
// past the first pull's 256 messages, with its reason; one never
// submitted is ErrNoResult; bad input is refused before any read.
func TestInspectJobReadsEveryDeadLetter(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	r := newCounter()
	r.poisoned = "bad"
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
	e.waitOwned(w)
	const n = deadScanBatch + 40
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Key: fmt.Sprintf("k%d", i), Payload: []byte("bad")}
	}
	out, err := e.client.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 30*time.Second, fmt.Sprintf("%d dead letters", n), func() bool { return e.streamMsgs(e.topo.Names.Dead()) == n })
	for _, i := range []int{0, deadScanBatch - 1, deadScanBatch, n - 1} {
		f, err := InspectJob(ctx(t), e.js, e.ns, out[i].ID, "")
		var re *RemoteError
		// Found by its kept outcome (a dead-lettered job of a batch keeps
		// it by ID: every job travels in a batch) or in the dead-letter
		// stream; either way its dead letter, found by the scan, beside it.
		if err != nil || (f.Where != FoundDead && f.Where != FoundResults) || f.Dead == nil || f.Dead.JobID != out[i].ID || f.Dead.Key != reqs[i].Key || !errors.As(f.Err, &re) || !re.DeadLettered {
			t.Fatalf("InspectJob of dead job %d (%s) = %+v, %v", i, out[i].ID, f, err)
		}
	}
	if _, err := InspectJob(ctx(t), e.js, e.ns, "never-1", ""); !errors.Is(err, ErrNoResult) {
		t.Fatalf("a job never submitted: %v", err)
	}
	if _, err := InspectJob(ctx(t), e.js, e.ns, "a..b", ""); !errors.Is(err, ErrBadJobID) {
		t.Fatalf("a bad job ID: %v", err)
	}
	if _, err := InspectJob(ctx(t), e.js, e.ns, "x-1", "bad\x00key"); err == nil {
		t.Fatal("a bad key was taken")
	}
	if _, _, err := InspectState(ctx(t), e.js, e.ns, ""); err == nil {
		t.Fatal("an empty key was taken")
	}
	if _, _, err := InspectState(ctx(t), e.js, "nope", "k1"); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("a namespace that does not exist: %v", err)
	}
}

// TestInspectJobLeavesNoConsumer: a look-up that reads the dead-letter
// stream deletes the consumer it read through.
func TestInspectJobLeavesNoConsumer(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	r.poisoned = "bad"
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, r })
	e.waitOwned(w)
	id, err := e.client.Submit(ctx(t), "k", []byte("bad"))
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "dead-lettered", func() bool { return e.streamMsgs(e.topo.Names.Dead()) == 1 })
	for range 3 {
		if f, err := InspectJob(ctx(t), e.js, e.ns, id, ""); err != nil || f.Dead == nil {
			t.Fatalf("InspectJob: %+v, %v", f, err)
		}
	}
	// The ordered consumer's Fetch replaces the consumer it was made
	// with, deleting that one on a goroutine of its own: it is gone
	// soon after the look-up, not always by its return.
	testwait.Eventually(t, 10*time.Second, "no consumer on the dead-letter stream after three look-ups", func() bool {
		s, err := e.js.Stream(ctx(t), e.topo.Names.Dead())
		return err == nil && s.CachedInfo().State.Consumers == 0
	})
}
