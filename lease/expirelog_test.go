package lease

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// lockedBuffer is a log sink the watchdog goroutine writes while the test
// reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// An expiry with no failed renew behind it (the host slept past the
// window) logs why the lease ended, never err=<nil>, and the window as a
// duration.
func TestExpiredLogSaysWhy(t *testing.T) {
	const ttl = time.Second
	var logs lockedBuffer
	clk := &suspendableClock{}
	kv := suspendBucket(t, ttl)
	cfg, err := Config{Holder: "holder", Logger: slog.New(slog.NewTextHandler(&logs, nil))}.resolve(t.Context(), kv)
	if err != nil {
		t.Fatal(err)
	}
	l, err := acquireOn(t.Context(), kv, "p.0", cfg, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.Release(ctx)
	})
	clk.suspend(2 * ttl)
	testwait.Eventually(t, 2*l.cfg.RenewEvery+200*time.Millisecond, "the watchdog logs the expiry", func() bool {
		return strings.Contains(logs.String(), "lease expired")
	})
	var line string
	for _, s := range strings.Split(logs.String(), "\n") {
		if strings.Contains(s, "lease expired") {
			line = s
		}
	}
	if strings.Contains(line, "<nil>") || !strings.Contains(line, "reason=") || !strings.Contains(line, "window="+l.cfg.window().String()) {
		t.Fatalf("expiry logged as %q; want a reason, the window as a duration, and no <nil>", line)
	}
}
