package keylane

import (
	"errors"
	"testing"
	"time"
)

// A client without an Observer reads no clock and allocates nothing at
// the measuring sites of its calls (a tenure's: internal/tenure's
// TestNoObserverCostsNothing).
func TestNoObserverCostsNothing(t *testing.T) {
	w := &Worker{}
	c := &Client{}
	if !c.now().IsZero() {
		t.Error("an unobserved client read the clock")
	}
	// Renews are off the job path: an unobserved worker still counts the
	// failed ones (keylane_lease_renew_failures_total, by worker).
	renewed := w.leaseRenewed()
	renewed(time.Millisecond, nil)
	renewed(time.Millisecond, errors.New("timeout"))
	if n := w.Stats().RenewFailures; n != 1 {
		t.Errorf("an unobserved worker counted %d failed renews, want 1", n)
	}
	allocs := testing.AllocsPerRun(1000, func() { clientMeasuringSites(c) })
	if allocs != 0 {
		t.Fatalf("unobserved measuring sites allocate %v times, want 0", allocs)
	}
}

// With an observer the client's sites allocate nothing either, and
// report what they measured.
func TestObserverSeesEverySite(t *testing.T) {
	var calls, submits, many int
	c := &Client{obs: &ClientObserver{
		Submitted:     func(time.Duration, error) { submits++ },
		Called:        func(time.Duration, error) { calls++ },
		SubmittedMany: func(_ time.Duration, jobs, _ int) { many += jobs },
	}}
	allocs := testing.AllocsPerRun(100, func() { clientMeasuringSites(c) })
	if allocs != 0 {
		t.Errorf("observed measuring sites allocate %v times, want 0", allocs)
	}
	calls, submits, many = 0, 0, 0
	clientMeasuringSites(c)
	clientMeasuringSites(c)
	if calls != 2 || submits != 2 || many != 0 {
		t.Errorf("observed calls %d, submits %d (want 2 each), many %d (0)", calls, submits, many)
	}
}

// clientMeasuringSites makes the calls a client makes for a job, as it
// makes them.
func clientMeasuringSites(c *Client) {
	var err error
	c.observeSubmit(c.now(), &err)
	c.observeCall(c.now(), &err)
	var out []Submitted
	c.observeSubmitMany(c.now(), &out, &err)
}
