package e2e

import (
	"errors"
	"github.com/keylane/keylane/wire"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCrashLoopJob: a job that kills every worker that runs it must not
// block its key forever. Each new owner counts the job's starts; once they
// pass MaxDeliver the job is dead-lettered and the key moves on.
func TestCrashLoopJob(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for two lease expiries")
	}
	c := startCluster(t, "e2e-crashloop", 3, "--max-deliver", "1", "--crash-on", "crash")
	key := "sku:crashy"
	c.setStock([]string{key}, []int64{10})

	crash := c.callAsync(key, "crash", keylane.WithID("crash-1"))
	after := c.callAsync(key, "buy 1", keylane.WithID("after-crash"))

	// The first run is not counted (it costs nothing on the common path);
	// the second owner records a restart and runs it (attempt 1 of
	// MaxDeliver=1 counted); the third finds one recorded restart, which
	// reaches MaxDeliver, and dead-letters the job without running it.
	dl := c.waitDeadLetter(30*time.Second, "the crashing job", func(m *jetstream.RawStreamMsg) bool {
		return wire.JobIDOfDead(m.Header) == "crash-1"
	})
	if e := dl.Header.Get(keylane.HeaderError); !strings.Contains(e, "restarted 1 times") {
		t.Errorf("dead letter error %q, want it to count one restart", e)
	}
	r := <-crash
	var re *keylane.RemoteError
	if !errors.As(r.err, &re) || !re.DeadLettered {
		t.Fatalf("crashing job: %q, %v; want a dead-lettered RemoteError", r.res, r.err)
	}
	a := <-after
	if a.err != nil || a.res != "sold 9" {
		t.Fatalf("the purchase behind the crashing job: %q, %v; want \"sold 9\"", a.res, a.err)
	}
	dead := 0
	for i := 0; i < 3; i++ {
		if c.worker(i).exited() {
			dead++
		}
	}
	if dead != 2 {
		t.Fatalf("%d workers died, want 2 (one per start before the limit)", dead)
	}
	t.Logf("crash loop ended after %d dead workers; dead letter: %s", dead, dl.Header.Get(keylane.HeaderError))
}
