package testwait_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// recorder is a TB whose Fatalf records instead of stopping the test.
type recorder struct{ failed string }

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestUntilReturnsTheValueOnceReady(t *testing.T) {
	n := 0
	got := testwait.Until(t, time.Second, "the third call", func() (int, bool) {
		n++
		return n, n == 3
	})
	if got != 3 {
		t.Fatalf("got %d, want 3", got)
	}
}

func TestUntilReportsTheLastValueOnTimeout(t *testing.T) {
	var r recorder
	start := time.Now()
	testwait.Until(&r, 50*time.Millisecond, "never", func() (string, bool) { return "still nothing", false })
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before the timeout", waited)
	}
	if !strings.Contains(r.failed, "never") || !strings.Contains(r.failed, "still nothing") {
		t.Fatalf("failure %q does not name the wait and the last value", r.failed)
	}
}

func TestEventuallyFailsWithTheMessage(t *testing.T) {
	var r recorder
	testwait.Eventually(&r, 20*time.Millisecond, "a false condition", func() bool { return false })
	if !strings.Contains(r.failed, "a false condition") {
		t.Fatalf("failure %q does not name the wait", r.failed)
	}
}

func TestPoll(t *testing.T) {
	busy := errors.New("busy")
	broken := errors.New("broken")
	t.Run("timeout wraps the last error", func(t *testing.T) {
		if err := testwait.Poll(20*time.Millisecond, func() error { return busy }); !errors.Is(err, busy) {
			t.Fatalf("got %v, want it to wrap %v", err, busy)
		}
	})
	t.Run("Stop ends the wait at once", func(t *testing.T) {
		calls := 0
		err := testwait.Poll(time.Minute, func() error { calls++; return testwait.Stop(broken) })
		if err != broken || calls != 1 {
			t.Fatalf("got %v after %d calls, want %v after 1", err, calls, broken)
		}
	})
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports, err := testwait.FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p == 0 || seen[p] {
			t.Fatalf("port %d handed out twice or zero: %v", p, ports)
		}
		seen[p] = true
	}
	if p := testwait.FreePort(t); p == 0 {
		t.Fatal("FreePort returned 0")
	}
}

// TestNoErrorBackoffSpacesItsTries: the pauses double (5, 10, 20, 40 ms…),
// so 300 ms see a handful of tries, not sixty; a success ends it, and a
// lasting failure fails with the last error.
func TestNoErrorBackoffSpacesItsTries(t *testing.T) {
	var r recorder
	tries := 0
	testwait.NoErrorBackoff(&r, 300*time.Millisecond, "the server", func() error {
		tries++
		return fmt.Errorf("no suitable peers (try %d)", tries)
	})
	if tries < 3 || tries > 8 {
		t.Fatalf("%d tries in 300ms, want a few (doubling pauses)", tries)
	}
	if !strings.Contains(r.failed, "the server") || !strings.Contains(r.failed, fmt.Sprintf("try %d", tries)) {
		t.Fatalf("failure %q does not name the wait and the last error", r.failed)
	}
	n := 0
	testwait.NoErrorBackoff(t, time.Second, "third try", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Fatalf("%d tries, want 3", n)
	}
}
