package testwait

import (
	"errors"
	"fmt"
	"time"
)

// TB is the part of testing.TB the helpers use; *testing.T, *testing.B
// and *testing.F satisfy it. Taking it instead of testing.TB keeps the
// testing package out of commands that link a test-support package
// (internal/redistest, internal/natscluster) which uses Poll or FreePorts.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Interval is how long the helpers sleep between two checks of a
// condition: short enough that a test measuring a reaction time is off by
// little, long enough not to keep a core busy.
const Interval = 5 * time.Millisecond

// Eventually polls cond until it is true, and fails the test with msg if
// it is still false once timeout has passed. Call it only from the test
// goroutine.
func Eventually(t TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	Until(t, timeout, msg, func() (struct{}, bool) { return struct{}{}, cond() })
}

// Until polls get until it reports ok and returns the value it got with
// it. If timeout passes first it fails the test with msg and the last value
// get returned, so the failure shows what the test saw instead. Call it
// only from the test goroutine.
func Until[T any](t TB, timeout time.Duration, msg string, get func() (T, bool)) T {
	t.Helper()
	var last T
	err := Poll(timeout, func() error {
		v, ok := get()
		last = v
		if !ok {
			return errNotYet
		}
		return nil
	})
	if err != nil {
		t.Fatalf("not within %s: %s (last seen: %+v)", timeout, msg, last)
	}
	return last
}

// NoError polls try until it returns nil, and fails the test with msg and
// try's last error if timeout passes first. Call it only from the test
// goroutine.
func NoError(t TB, timeout time.Duration, msg string, try func() error) {
	t.Helper()
	if err := Poll(timeout, try); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
}

// errNotYet is Until's error for a value that is not there yet.
var errNotYet = errors.New("testwait: not yet")

// Stop marks err as final: Poll returns it at once instead of trying
// again. Use it for an error that waiting cannot cure.
func Stop(err error) error { return &stopError{err} }

type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// Poll calls try until it returns nil, and returns nil then. If timeout
// passes first it returns an error that wraps try's last error; if try
// returns an error made by Stop, it returns that error's cause at once.
func Poll(timeout time.Duration, try func() error) error {
	return poll(timeout, try, false)
}

// poll is Poll; with backoff the pause doubles after each try, up to a
// second.
func poll(timeout time.Duration, try func() error, backoff bool) error {
	deadline := time.Now().Add(timeout)
	pause := Interval
	for {
		err := try()
		if err == nil {
			return nil
		}
		if stop, ok := errors.AsType[*stopError](err); ok {
			return stop.err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(min(pause, max(time.Until(deadline), 0)+Interval))
		if backoff {
			pause = min(2*pause, time.Second)
		}
	}
}

// NoErrorBackoff is NoError for a try that asks a server something: the
// pause between tries doubles from Interval up to a second, so a failure
// that lasts (an election, a placement the server cannot make yet) is
// not answered with a request every few milliseconds. A try that returns
// Stop(err) ends it at once, as in Poll.
func NoErrorBackoff(t TB, timeout time.Duration, msg string, try func() error) {
	t.Helper()
	if err := poll(timeout, try, true); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
}
