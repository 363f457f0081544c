package keylane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// TestReplayedFailureReplyCarriesTheKeptText: a Call retried by ID after
// the duplicate window is answered from the kept outcome (PROTOCOL.md
// § 11). Its reply must carry the same Keylane-Error text as the first
// run's reply, the handler's, not the Go client's rendering of it.
//
// It failed before: "replayed reply decodes to {Message:keylane: job
// failed (dead-lettered): no such item …}, the first run's to
// {Message:no such item …}". replay hands finish the kept outcome as a
// *RemoteError, and replyMsg wrote its Error(), which adds the client's
// "keylane: job failed (dead-lettered): " prefix (the Go client then showed
// it twice); a batched job's replay recorded the same text in its batch
// entry. replyMsg and encodeResult now write a *RemoteError's Message
// (errMessage), as outcomeMsg does.
func TestReplayedFailureReplyCarriesTheKeptText(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var runs atomic.Int32
	e.waitOwned(e.worker("w1", HandlerFunc(func(context.Context, Job) ([]byte, error) {
		runs.Add(1)
		return nil, Permanent(errors.New("no such item"))
	}), nil))
	_, err := e.client.Call(ctx(t), "sku-1", []byte("buy"), WithID("buy-1"))
	var first *RemoteError
	if !errors.As(err, &first) || first.Message != "no such item" || !first.DeadLettered {
		t.Fatalf("first call: %v", err)
	}
	// What the worker kept for buy-1, now under an ID the stream has not
	// seen: as a retry after the duplicate window, looked up and replayed.
	v, err := e.topo.Results.Get(ctx(t), "buy-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.topo.Results.Put(ctx(t), "buy-2", v.Value()); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.Call(ctx(t), "sku-1", []byte("buy"), WithID("buy-2"))
	var again *RemoteError
	if !errors.As(err, &again) {
		t.Fatalf("replayed call: %v", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1 (the replay must not run it)", runs.Load())
	}
	if *again != *first {
		t.Fatalf("replayed reply decodes to %+v, the first run's to %+v", *again, *first)
	}
}
