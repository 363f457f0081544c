package keylane

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain: a Handler's job kept
// its outcome under its ID; the entry is then garbled (the results bucket
// is written by workers only, so that is never legit) and the same job
// is submitted again by its ID after the duplicate window. Its kept
// outcome exists but cannot be read: the job must not run again, it is
// dead-lettered saying why, and its caller gets that. Before, the look-up
// read an entry that does not decode as "none kept" (keptValue) and the
// handler ran a second time, as a batch's garbled entry did before
// TestGarbledBatchEntryNeverRunsTheJobAgain.
func TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	e.shortDuplicateWindow()
	var handled atomic.Int64
	w := e.worker("w", HandlerFunc(func(_ context.Context, job Job) ([]byte, error) {
		if job.Key == "probe" {
			return nil, nil
		}
		handled.Add(1)
		return []byte("paid"), nil
	}), nil)
	e.waitOwned(w)
	if _, err := e.client.Call(ctx(t), "order:1", nil, WithID("pay-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.topo.Results.Put(ctx(t), "pay-1", []byte("Zgarbled")); err != nil {
		t.Fatal(err)
	}
	e.duplicateWindowPassed(t, "probe-1")
	cctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
	defer cancel()
	res, err := e.client.Call(cctx, "order:1", nil, WithID("pay-1"))
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "unreadable") {
		t.Fatalf("the job again by its ID = %q, %v; want a dead letter saying its kept outcome is unreadable (handler ran %d times)", res, err, handled.Load())
	}
	if n := handled.Load(); n != 1 {
		t.Fatalf("handler ran %d times for one job ID", n)
	}
}
