package keylane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

type nopApplier struct{}

func (nopApplier) ApplyGroup(context.Context, JobGroup) ([]JobOutcome, error) { return nil, nil }

// TestWorkerConfigOneRunner: NewWorker takes exactly one of Handler,
// Reducer and Applier, and says so. Fails if two (or none) are accepted.
func TestWorkerConfigOneRunner(t *testing.T) {
	h := HandlerFunc(func(context.Context, Job) ([]byte, error) { return nil, nil })
	r := ReducerFunc(func(context.Context, Job, []byte) ([]byte, []byte, error) { return nil, nil, nil })
	for name, cfg := range map[string]WorkerConfig{
		"none":            {},
		"handler+applier": {Handler: h, Applier: nopApplier{}},
		"reducer+applier": {Reducer: r, Applier: nopApplier{}},
		"handler+reducer": {Handler: h, Reducer: r},
		"all three":       {Handler: h, Reducer: r, Applier: nopApplier{}},
	} {
		err := cfg.setDefaults()
		if err == nil || !strings.Contains(err.Error(), "exactly one of Handler, Reducer and Applier") {
			t.Errorf("%s: %v, want the exactly-one error", name, err)
		}
	}
	cfg := WorkerConfig{Applier: nopApplier{}}
	if err := cfg.setDefaults(); err != nil {
		t.Errorf("applier alone: %v", err)
	}
}

// refusingApplier refuses every call for good (a revoked privilege) until
// fixed, then applies each job, answering "ok".
type refusingApplier struct {
	fixed atomic.Bool
	calls atomic.Int64
}

func (a *refusingApplier) ApplyGroup(_ context.Context, g JobGroup) ([]JobOutcome, error) {
	if a.calls.Add(1); !a.fixed.Load() {
		return nil, Permanent(errors.New("ERROR: permission denied for table keylane_outcomes (SQLSTATE 42501)"))
	}
	return allOK(len(g.Jobs)), nil
}

// TestApplierRefusingForGoodHoldsTheJob: an Applier whose whole call is
// refused for good (errors.Is ErrPermanent: keylane's own table dropped,
// a privilege revoked) is an operator's to fix, not the job's fault: the
// job is held and tried again with backoff, never dead-lettered for it,
// and every refused attempt is counted (Stats.ApplierRefusals) and said at
// ERROR. Once fixed, the job applies and its caller is answered.
func TestApplierRefusingForGoodHoldsTheJob(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	a := &refusingApplier{}
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Applier = nil, a })
	e.waitOwned(w)
	done := make(chan error, 1)
	go func() {
		res, err := e.client.Call(ctx(t), "sku:1", []byte("buy"))
		if err == nil && string(res) != "ok" {
			err = fmt.Errorf("answered %q", res)
		}
		done <- err
	}()
	testwait.Eventually(t, 20*time.Second, "the refusals counted", func() bool { return w.Stats().ApplierRefusals >= 2 })
	a.fixed.Store(true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the held job's call: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held job never applied once the applier was fixed")
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %+v, %v; want none (the refusal is not the job's)", dls, err)
	}
}

// shortApplier answers fewer outcomes than jobs: a broken contract.
type shortApplier struct{}

func (shortApplier) ApplyGroup(context.Context, JobGroup) ([]JobOutcome, error) { return nil, nil }

// TestApplierBreakingItsContractIsSaidForGood: an Applier that returns
// fewer outcomes than jobs is not retried as a transient outage with a
// WARN line for ever: each attempt is counted as a refusal for good (an
// operator's to fix) and the job is held, never dead-lettered or acked.
// Before, it was filed as a failed transaction and ApplierRefusals stayed 0.
func TestApplierBreakingItsContractIsSaidForGood(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Applier = nil, shortApplier{} })
	e.waitOwned(w)
	if _, err := e.client.Submit(ctx(t), "sku:1", []byte("buy")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the broken contract counted", func() bool { return w.Stats().ApplierRefusals >= 2 })
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %+v, %v; want none", dls, err)
	}
}

// gatedApplier holds its first call until open is closed, and records how
// many jobs each call carried.
type gatedApplier struct {
	open  chan struct{}
	first atomic.Bool
	sizes chan int
}

func (a *gatedApplier) ApplyGroup(_ context.Context, g JobGroup) ([]JobOutcome, error) {
	if a.first.CompareAndSwap(false, true) {
		<-a.open
	}
	a.sizes <- len(g.Jobs)
	return allOK(len(g.Jobs)), nil
}

// TestApplierJoinsManyKeysInOneTransaction: while a partition's
// transaction is in flight, the ready groups of its other keys queue for
// the next one, as many keys as Concurrency lets run at once; with an
// Applier that defaults to DefaultApplierConcurrency, not the Handler's 8.
// 40 keys' jobs arrive behind a held transaction and must all go in the
// next call. Failed before: only 8 keys ever reached the applier at once
// (Stats.Runs stayed at 8), so a skewed sale's transactions carried 8
// keys at most.
func TestApplierJoinsManyKeysInOneTransaction(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	a := &gatedApplier{open: make(chan struct{}), sizes: make(chan int, 100)}
	var release sync.Once
	open := func() { release.Do(func() { close(a.open) }) }
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Applier, c.Concurrency = nil, a, 0 })
	t.Cleanup(open) // after the worker's: a failed wait must not leave its stop waiting on the held call
	e.waitOwned(w)
	if _, err := e.client.Submit(ctx(t), "sku:held", []byte("buy")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the first transaction in flight", func() bool { return w.Stats().Runs >= 1 })
	const keys = 40
	for i := range keys {
		if _, err := e.client.Submit(ctx(t), fmt.Sprintf("sku:%d", i), []byte("buy")); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 20*time.Second, fmt.Sprintf("%d keys queued behind the held transaction (Concurrency caps them)", keys), func() bool {
		return w.Stats().Runs >= keys+1
	})
	open()
	next := func() int {
		return testwait.Until(t, 20*time.Second, "the next call", func() (int, bool) {
			select {
			case n := <-a.sizes:
				return n, true
			default:
				return 0, false
			}
		})
	}
	if n := next(); n != 1 {
		t.Fatalf("the held call carried %d jobs, want 1", n)
	}
	if n := next(); n != keys {
		t.Fatalf("the next call carried %d jobs, want all %d queued keys'", n, keys)
	}
}

// allOK is n outcomes, each done with result "ok".
func allOK(n int) []JobOutcome {
	out := make([]JobOutcome, n)
	for i := range out {
		out[i] = JobOutcome{Result: []byte("ok"), Done: true}
	}
	return out
}
