package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
)

// TestBacklogMemoryBounded stores a backlog of jobs with no worker running,
// then starts one worker process and samples its RSS until the backlog is
// drained. The worker holds at most MaxInFlight fetched jobs per partition,
// so its memory must not grow with the backlog. The default backlog is
// small enough for CI; measure the real thing with
//
//	KEYLANE_BACKLOG=1000000 go test -run BacklogMemory -v ./e2e
func TestBacklogMemoryBounded(t *testing.T) {
	backlog := 30_000
	if s := os.Getenv("KEYLANE_BACKLOG"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 5_000_000 {
			t.Fatalf("KEYLANE_BACKLOG=%q: want 1..5000000", s)
		}
		backlog = n
	}
	c := startCluster(t, "backlog", 1, "--trace", "")
	if _, err := c.stop(c.worker(0), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	const chunk = 20_000
	for sent := 0; sent < backlog; sent += chunk {
		reqs := make([]keylane.Request, min(chunk, backlog-sent))
		for i := range reqs {
			reqs[i] = keylane.Request{Key: fmt.Sprintf("sku:%d", (sent+i)%1000), Payload: []byte("restock 1")}
		}
		out, err := c.client.SubmitMany(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range out {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
		}
	}
	t.Logf("stored %d jobs in %s", backlog, time.Since(start).Round(time.Millisecond))

	w := c.startWorker("backlog-w1")
	start = time.Now()
	var peak int64
	testwait.Eventually(t, 15*time.Minute, "backlog drained", func() bool {
		peak = max(peak, rssKB(t, w.cmd.Process.Pid))
		n, err := c.client.Backlog(ctx)
		return err == nil && n == 0
	})
	took := time.Since(start)
	t.Logf("drained %d jobs in %s (%.0f jobs/s); worker peak RSS %.1f MB",
		backlog, took.Round(time.Millisecond), float64(backlog)/took.Seconds(), float64(peak)/1024)
	// 1000 SKUs got backlog/1000 restocks each: every job applied once.
	for _, sku := range []string{"sku:0", "sku:999"} {
		if got, want := c.stock(sku), int64(backlog/1000); got != want {
			t.Fatalf("%s stock %d, want %d", sku, got, want)
		}
	}
	// In flight at most MaxInFlight (1024) jobs per partition: a few tens
	// of MB. 256 MB leaves room for the runtime and says "bounded".
	if peak > 256<<10 {
		t.Fatalf("worker peak RSS %.1f MB with a backlog of %d: memory grows with the backlog", float64(peak)/1024, backlog)
	}
}

// rssKB reads a process's resident set size.
func rssKB(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}
