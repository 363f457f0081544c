package keylanepg_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// history collects what Apply calls answered, for the checks after a run.
type history struct {
	mu       sync.Mutex
	answered map[string]keylanepg.Outcome // job ID -> its first answer, applied or recorded
	bad      []string                     // jobs applied twice, or answered two ways
	stale    int
}

func newHistory() *history { return &history{answered: map[string]keylanepg.Outcome{}} }

// add takes a successful Apply's outcomes. A job applied when it had been
// answered before was applied twice; a job answered from the record must
// be answered as before (a job whose first answer was lost with a commit
// is first answered from the record).
func (h *history) add(out []keylanepg.Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range out {
		if !o.Done() {
			continue
		}
		prev, ok := h.answered[o.JobID]
		switch {
		case ok && o.Status == keylanepg.Applied:
			h.bad = append(h.bad, fmt.Sprintf("%s applied twice", o.JobID))
		case ok && string(prev.Result) != string(o.Result):
			h.bad = append(h.bad, fmt.Sprintf("%s answered %q, then %q", o.JobID, prev.Result, o.Result))
		case !ok:
			h.answered[o.JobID] = o
		}
	}
}

// check holds the run against the database's rows: nothing applied
// twice; stock = start - sold; one order row per sold job, none extra,
// each with its outcome; every "sold L" left a distinct L, from start-1
// down (the sales are a serial history); the recorded outcomes are
// exactly the answered jobs, with their answers. Only sku's jobs count.
func (h *history) check(t *testing.T, db dbQuerier, sku string, start int64, all []string) {
	t.Helper()
	for _, b := range h.bad {
		t.Error(b)
	}
	var sold int64
	lefts := map[int64]bool{}
	applied := map[string]string{}
	for id, o := range h.answered {
		if o.Key == sku {
			applied[id] = string(o.Result)
		}
	}
	for id, res := range applied {
		if l, ok := strings.CutPrefix(res, "sold "); ok {
			sold++
			n, _ := strconv.ParseInt(l, 10, 64)
			if lefts[n] {
				t.Errorf("job %s left %d, as another sale did", id, n)
			}
			lefts[n] = true
		}
	}
	for n := start - sold; n < start; n++ {
		if !lefts[n] {
			t.Errorf("no sale left %d (sold %d of %d)", n, sold, start)
		}
	}
	a, err := shop.AuditSKU(context.Background(), db, ns, sku)
	if err != nil {
		t.Fatal(err)
	}
	if want := (shop.Audit{Stock: start - sold, Orders: sold, Units: sold}); a != want {
		t.Errorf("database %+v, want %+v (from %d answered sales)", a, want, sold)
	}
	rec, err := keylanepg.Lookup(context.Background(), db, ns, all)
	if err != nil {
		t.Fatal(err)
	}
	for id, o := range rec {
		if o.Key != sku {
			delete(rec, id)
		}
	}
	if len(rec) != len(applied) {
		t.Errorf("%d outcomes recorded, %d jobs answered", len(rec), len(applied))
	}
	for id, res := range applied {
		if string(rec[id].Result) != res {
			t.Errorf("job %s: recorded %q, applied as %q", id, rec[id].Result, res)
		}
	}
}

type dbQuerier interface {
	shop.Querier
	keylanepg.DB
}

// TestConcurrentHotSKU has 64 goroutines apply groups of purchases of one
// hot SKU at once, as owners of 8 partitions with 8 fences each (so owners
// of one partition depose each other), each group after the first also
// redelivering the goroutine's previous group. The history holds: no job
// applied twice, stock = start - sold, one order row per sale, a serial
// history of stock levels, outcomes recorded for exactly the applied jobs.
// Run for every kind of handler (applyAs): the pipeline's groups that
// redeliver take its careful path, the others its fast one.
func TestConcurrentHotSKU(t *testing.T) { forKinds(t, testConcurrentHotSKU) }

func testConcurrentHotSKU(t *testing.T, kind string) {
	_, db := startShop(t, 64)
	const start = 100
	setStock(t, db, "hot", start)
	hist := newHistory()
	var (
		wg     sync.WaitGroup
		errsMu sync.Mutex
		errs   []error
		idsMu  sync.Mutex
		all    []string
	)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var prev []keylane.Job
			for round := range 4 {
				jobs := append([]keylane.Job(nil), prev...)
				for k := range 1 + (i+round)%4 {
					jobs = append(jobs, buy(fmt.Sprintf("g%d-r%d-%d", i, round, k), "hot"))
				}
				idsMu.Lock()
				for _, j := range jobs[len(prev):] {
					all = append(all, j.ID)
				}
				idsMu.Unlock()
				out, err := applyAs(context.Background(), kind, db, group(i%8, uint64(1+i/8), jobs...))
				if errors.Is(err, keylane.ErrStaleFence) {
					hist.mu.Lock()
					hist.stale++
					hist.mu.Unlock()
					prev = jobs
					continue
				}
				if err != nil {
					errsMu.Lock()
					errs = append(errs, err)
					errsMu.Unlock()
					return
				}
				hist.add(out)
				for k, o := range out {
					if !o.Done() {
						errsMu.Lock()
						errs = append(errs, fmt.Errorf("job %s: %s %v", jobs[k].ID, o.Status, o.Err))
						errsMu.Unlock()
					}
				}
				prev = jobs[len(prev):]
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	soldOut := 0
	for _, o := range hist.answered {
		if strings.HasPrefix(string(o.Result), "soldout ") {
			soldOut++
		}
	}
	t.Logf("%d jobs applied (%d sold out), %d groups refused as stale", len(hist.answered), soldOut, hist.stale)
	hist.check(t, db, "hot", start, all)
}
