package proctest

import (
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

func TestStartCapturesAndStops(t *testing.T) {
	p := Start(t, "sh", "-c", "echo ready; exec sleep 60")
	testwait.Eventually(t, 10*time.Second, "the process's output", func() bool { return strings.Contains(p.Out.String(), "ready") })
	p.Stop(t, 10*time.Second)
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the process exited")
	}
}

func TestStopFailsTheTestWhenTermIsIgnored(t *testing.T) {
	rec := &recorder{TB: t}
	p := Start(t, "sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 1; done")
	testwait.Eventually(t, 10*time.Second, "the trap set", func() bool { return strings.Contains(p.Out.String(), "trapped") })
	p.Stop(rec, 200*time.Millisecond)
	if !rec.failed {
		t.Fatal("a process that ignored SIGTERM passed Stop")
	}
}

// recorder is a testing.TB whose Errorf is noted, not reported.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Helper()               {}
