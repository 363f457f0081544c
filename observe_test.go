package keylane

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// A worker or client without an Observer reads no clock and allocates
// nothing at the measuring sites of the job path.
func TestNoObserverCostsNothing(t *testing.T) {
	w := &Worker{}
	o := &owner{p: 1}
	c := &Client{}
	ts := []*task{{stored: time.Now()}}
	run := func([]*task) {}
	if got := o.observeQueueWait(run); reflect.ValueOf(got).Pointer() != reflect.ValueOf(run).Pointer() {
		t.Error("without an observer the run function is wrapped")
	}
	if !w.now().IsZero() || !c.now().IsZero() {
		t.Error("an unobserved worker or client read the clock")
	}
	// Renews are off the job path: an unobserved worker still counts the
	// failed ones (keylane_lease_renew_failures_total, by worker).
	renewed := w.leaseRenewed()
	renewed(time.Millisecond, nil)
	renewed(time.Millisecond, errors.New("timeout"))
	if n := w.Stats().RenewFailures; n != 1 {
		t.Errorf("an unobserved worker counted %d failed renews, want 1", n)
	}
	allocs := testing.AllocsPerRun(1000, func() { measuringSites(w, o, c, run, ts) })
	if allocs != 0 {
		t.Fatalf("unobserved measuring sites allocate %v times, want 0", allocs)
	}
}

// With an observer the sites allocate nothing either, and report what
// they measured.
func TestObserverSeesEverySite(t *testing.T) {
	var waits, runs, groups, settled, calls, submits, many int
	w := &Worker{cfg: WorkerConfig{Observer: &WorkerObserver{
		QueueWait: func(p int, d time.Duration) { waits++ },
		Run:       func(p int, d time.Duration) { runs++ },
		Group:     func(p, jobs int) { groups += jobs },
		Settled:   func(p int, d time.Duration) { settled++ },
	}}}
	c := &Client{obs: &ClientObserver{
		Submitted:     func(time.Duration, error) { submits++ },
		Called:        func(time.Duration, error) { calls++ },
		SubmittedMany: func(_ time.Duration, jobs, _ int) { many += jobs },
	}}
	o := &owner{cfg: ownerConfig{Observer: w.cfg.Observer}, p: 1}
	ts := []*task{{stored: time.Now()}}
	run := o.observeQueueWait(func([]*task) {})
	allocs := testing.AllocsPerRun(100, func() { measuringSites(w, o, c, run, ts) })
	if allocs != 0 {
		t.Errorf("observed measuring sites allocate %v times, want 0", allocs)
	}
	ts[0].started = false
	waits, runs, groups, settled, calls, submits, many = 0, 0, 0, 0, 0, 0, 0
	measuringSites(w, o, c, run, ts)
	measuringSites(w, o, c, run, ts)
	if waits != 1 || runs != 4 || groups != 6 || settled != 2 || calls != 2 || submits != 2 || many != 0 {
		t.Errorf("observed waits %d (want 1: a task once), runs %d (4), group jobs %d (6), settled %d (2), calls %d, submits %d (2 each), many %d (0)",
			waits, runs, groups, settled, calls, submits, many)
	}
}

// measuringSites makes the calls the job path makes for a job, as it
// makes them; run is o.observeQueueWait of a run function, wrapped once
// per consumer as owner.run does.
func measuringSites(w *Worker, o *owner, c *Client, run func([]*task), ts []*task) {
	run(ts)
	o.observeRun(w.now())
	n, werr := 3, error(nil)
	o.observeGroup(w.now(), &n, &werr)
	o.observeSettled(ts[0])
	var err error
	c.observeSubmit(c.now(), &err)
	c.observeCall(c.now(), &err)
	var out []Submitted
	c.observeSubmitMany(c.now(), &out, &err)
}

// BenchmarkMeasuringSites shows the cost of the measuring sites per job,
// without and with an observer (the Prometheus one lives in package
// metrics).
func BenchmarkMeasuringSites(b *testing.B) {
	nop := &WorkerObserver{
		QueueWait: func(int, time.Duration) {}, Run: func(int, time.Duration) {},
		Group: func(int, int) {}, Settled: func(int, time.Duration) {},
	}
	for _, bc := range []struct {
		name string
		obs  *WorkerObserver
	}{{"off", nil}, {"on", nop}} {
		b.Run(bc.name, func(b *testing.B) {
			w := &Worker{cfg: WorkerConfig{Observer: bc.obs}}
			o := &owner{cfg: ownerConfig{Observer: bc.obs}}
			c := &Client{}
			ts := []*task{{stored: time.Now()}}
			run := o.observeQueueWait(func([]*task) {})
			b.ReportAllocs()
			for b.Loop() {
				ts[0].started = false
				measuringSites(w, o, c, run, ts)
			}
		})
	}
}
