package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/sale"
)

// TestSaleLocalPostgres runs the command against a throwaway postgres:
// a zipf sale over 3 SKUs, checked against the database's rows, with
// each kind of handler: --handler set (the default, shop.SellSet),
// pipeline (shop.SellPipeline) and handler (shop.Sell). Fails if a verdict line is missing or
// says FAILED (per-key concurrency, order, oversell, the database's rows
// against the buyers' answers), or if the sale did not use the kind asked.
func TestSaleLocalPostgres(t *testing.T) {
	for _, tc := range []struct {
		name, flag, kind string
	}{
		{"set", "--handler=set", "shop.SellSet"},
		{"pipeline", "--handler=pipeline", "shop.SellPipeline"},
		{"handler", "--handler=handler", "shop.Sell,"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			err := run(ctx, []string{"--postgres", "local", tc.flag, "--skus", "3", "--stock", "100", "--purchases", "600", "--buyers", "32", "--workers", "2", "--partitions", "4"}, &out, &errOut)
			t.Log(out.String())
			if err != nil {
				t.Fatalf("sale: %v\n%s", err, errOut.String())
			}
			for _, want := range []string{"verdict: OK", "max concurrent runs per key 1 (must be 1), out-of-order runs 0",
				"stock = start − sold for 3 of 3 SKUs, 0 rows without their outcome", "verdict (database): OK",
				"synchronous_commit=on", "(keylanepg, " + tc.kind} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
		})
	}
}

// TestSaleNeedsPostgres: without --postgres the command says what it needs.
func TestSaleNeedsPostgres(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var out, errOut bytes.Buffer
	err := run(context.Background(), nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--postgres") {
		t.Fatalf("got %v, want an error naming --postgres", err)
	}
}

// TestTrackedGroupsSeesOverlapAndOrder: trackedGroups, the pipeline's
// tracking, counts a key in two calls at once as two concurrent runs, a
// key's jobs of one call as one, and a call of a key's earlier job after
// a later one as out of order. Fails if the verdict's per-key checks
// could not see the pipeline break keylane's promises.
func TestTrackedGroupsSeesOverlapAndOrder(t *testing.T) {
	job := func(key string, seq uint64) keylane.Job {
		return keylane.Job{ID: key + string(rune('0'+seq)), Key: key, Seq: seq}
	}
	tr := sale.NewTracker(nil, "")
	in, release := make(chan struct{}), make(chan struct{})
	a := trackedGroups{tr: tr, app: applierFunc(func(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
		if g.Jobs[0].Seq == 1 {
			in <- struct{}{}
			<-release
		}
		return make([]keylane.JobOutcome, len(g.Jobs)), nil
	})}
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = a.ApplyGroup(ctx, keylane.JobGroup{Jobs: []keylane.Job{job("a", 1), job("b", 2), job("a", 3), job("a", 4)}})
	}()
	<-in
	if got := tr.MaxConcurrent(); got != 1 {
		t.Errorf("one call with three jobs of a key: %d concurrent runs, want 1", got)
	}
	_, _ = a.ApplyGroup(ctx, keylane.JobGroup{Jobs: []keylane.Job{job("a", 5)}}) // while the first call is in
	close(release)
	<-done
	if got := tr.MaxConcurrent(); got != 2 {
		t.Errorf("a key in two calls at once: %d concurrent runs, want 2", got)
	}
	if got := tr.OrderViolations(); got != 0 {
		t.Errorf("%d out-of-order runs, want 0", got)
	}
	_, _ = a.ApplyGroup(ctx, keylane.JobGroup{Jobs: []keylane.Job{job("a", 2)}})
	if got := tr.OrderViolations(); got != 1 {
		t.Errorf("a key's job 2 after its job 5: %d out-of-order runs, want 1", got)
	}
}

type applierFunc func(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error)

func (f applierFunc) ApplyGroup(ctx context.Context, g keylane.JobGroup) ([]keylane.JobOutcome, error) {
	return f(ctx, g)
}
