package tenure

import (
	"reflect"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/core"
)

// A tenure without an Observer reads no clock and allocates nothing at
// the measuring sites of the job path (a client's: package keylane's
// TestNoObserverCostsNothing).
func TestNoObserverCostsNothing(t *testing.T) {
	o := &Owner{p: 1}
	ts := []*task{{stored: time.Now()}}
	run := func([]*task) {}
	if got := o.observeQueueWait(run); reflect.ValueOf(got).Pointer() != reflect.ValueOf(run).Pointer() {
		t.Error("without an observer the run function is wrapped")
	}
	if !o.now().IsZero() {
		t.Error("an unobserved tenure read the clock")
	}
	allocs := testing.AllocsPerRun(1000, func() { measuringSites(o, run, ts) })
	if allocs != 0 {
		t.Fatalf("unobserved measuring sites allocate %v times, want 0", allocs)
	}
}

// With an observer the sites allocate nothing either, and report what
// they measured.
func TestObserverSeesEverySite(t *testing.T) {
	var waits, runs, groups, settled int
	o := &Owner{p: 1, cfg: Config{Observer: &core.WorkerObserver{
		QueueWait: func(p int, d time.Duration) { waits++ },
		Run:       func(p int, d time.Duration) { runs++ },
		Group:     func(p, jobs int) { groups += jobs },
		Settled:   func(p int, d time.Duration) { settled++ },
	}}}
	ts := []*task{{stored: time.Now()}}
	run := o.observeQueueWait(func([]*task) {})
	allocs := testing.AllocsPerRun(100, func() { measuringSites(o, run, ts) })
	if allocs != 0 {
		t.Errorf("observed measuring sites allocate %v times, want 0", allocs)
	}
	ts[0].started = false
	waits, runs, groups, settled = 0, 0, 0, 0
	measuringSites(o, run, ts)
	measuringSites(o, run, ts)
	if waits != 1 || runs != 4 || groups != 6 || settled != 2 {
		t.Errorf("observed waits %d (want 1: a task once), runs %d (4), group jobs %d (6), settled %d (2)",
			waits, runs, groups, settled)
	}
}

// measuringSites makes the calls the job path makes for a job, as it
// makes them; run is o.observeQueueWait of a run function, wrapped once
// per consumer as Owner.run does.
func measuringSites(o *Owner, run func([]*task), ts []*task) {
	run(ts)
	o.observeRun(o.now())
	n, werr := 3, error(nil)
	o.observeGroup(o.now(), &n, &werr)
	o.observeSettled(ts[0])
}

// BenchmarkMeasuringSites shows the cost of the measuring sites per job,
// without and with an observer (the Prometheus one lives in package
// metrics).
func BenchmarkMeasuringSites(b *testing.B) {
	nop := &core.WorkerObserver{
		QueueWait: func(int, time.Duration) {}, Run: func(int, time.Duration) {},
		Group: func(int, int) {}, Settled: func(int, time.Duration) {},
	}
	for _, bc := range []struct {
		name string
		obs  *core.WorkerObserver
	}{{"off", nil}, {"on", nop}} {
		b.Run(bc.name, func(b *testing.B) {
			o := &Owner{cfg: Config{Observer: bc.obs}}
			ts := []*task{{stored: time.Now()}}
			run := o.observeQueueWait(func([]*task) {})
			b.ReportAllocs()
			for b.Loop() {
				ts[0].started = false
				measuringSites(o, run, ts)
			}
		})
	}
}
