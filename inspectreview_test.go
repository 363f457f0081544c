package keylane

import (
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
)

// TestInspectJobOfABatchedJobNotInItsBatchEntry: a batch whose Calls have
// their outcomes kept in the batch's entry also carries a Submit (not
// kept there) that is dead-lettered. InspectJob of that Submit's ID finds
// its dead letter, and an index the batch never had is ErrNoResult: the
// batch entry not holding an index is "not kept there", not a malformed
// entry. Before, both failed with "stored outcome of … in its batch's
// entry: … holds no outcome at index …".
func TestInspectJobOfABatchedJobNotInItsBatchEntry(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	r := newCounter()
	r.poisoned = "poison"
	batchWorker(e, "w", r)
	const reply = "_INBOX.review.nobody"
	e.publishBatch(0, "inspect-mixed", []wire.BatchJob{
		{Key: "seat:a", Reply: reply, KeepOutcome: true, Payload: []byte("1")},
		{Key: "seat:b", Payload: []byte("poison")},
		{Key: "seat:a", Reply: reply, KeepOutcome: true, Payload: []byte("2")},
	})
	batchID := testBatchID("inspect-mixed")
	testwait.Eventually(t, 10*time.Second, "the batch acked", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	testwait.Eventually(t, 10*time.Second, "the poisoned job dead-lettered", func() bool { return e.streamMsgs(e.topo.Names.Dead()) == 1 })
	if _, batches := e.resultsKeys(); len(batches[batchID]) != 2 {
		t.Fatalf("batch entries %v: want the two Calls' outcomes in %s's", batches, batchID)
	}
	f, err := InspectJob(ctx(t), e.js, e.ns, wire.BatchedJobID(batchID, 0), "")
	if err != nil || f.Where != FoundBatch {
		t.Fatalf("the batch's Call: %+v, %v", f, err)
	}
	dead := wire.BatchedJobID(batchID, 1)
	f, err = InspectJob(ctx(t), e.js, e.ns, dead, "")
	var re *RemoteError
	// Found by its ID (a batch's dead-lettered job keeps its outcome so,
	// for a redelivery of the batch), with its dead letter.
	if err != nil || f.Where != FoundDead && f.Where != FoundResults || f.Dead == nil || f.Dead.JobID != dead || !errors.As(f.Err, &re) || !re.DeadLettered {
		t.Fatalf("the batch's dead-lettered Submit %s: %+v, %v; want its dead letter", dead, f, err)
	}
	if f, err := InspectJob(ctx(t), e.js, e.ns, wire.BatchedJobID(batchID, 7), ""); !errors.Is(err, ErrNoResult) {
		t.Fatalf("an index the batch never had: %+v, %v; want ErrNoResult", f, err)
	}
}

// TestInspectJobEndsWhenTheDeadStreamGoesMidScan: the dead-letter stream
// deleted after InspectJob's scan made its consumer (a keylane namespace
// delete under a status page's look-up): the look-up fails, saying why,
// instead of waiting for ever. Before, the ordered consumer's first pull
// tried to make its next consumer again and again (nats.go's default
// MaxResetAttempts: no end), bound by no context.
func TestInspectJobEndsWhenTheDeadStreamGoesMidScan(t *testing.T) {
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
	deadScanStarted = func() {
		if err := e.js.DeleteStream(ctx(t), e.topo.Names.Dead()); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { deadScanStarted = nil })
	done := make(chan error, 1)
	go func() {
		_, err := InspectJob(ctx(t), e.js, e.ns, id+"-other", "")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, ErrNoResult) {
			t.Fatalf("InspectJob with its dead-letter stream deleted mid-scan: %v; want the read's failure", err)
		}
		t.Logf("InspectJob: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("InspectJob did not return within 60s of its dead-letter stream's deletion")
	}
}
