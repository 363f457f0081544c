package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/testwait"
)

// A second SIGINT while a worker drains ends it at once, with a non-zero
// status and a line saying why, instead of waiting out a handler that
// does not finish. With --log-format json every line it writes, that one
// included, is one JSON object.
func TestSecondSignalForcesTheExit(t *testing.T) {
	c := startCluster(t, "sig2", 1, "--hold", "5m", "--drain", "5m", "--log-format", "json")
	w := c.worker(0)
	if _, err := c.client.Submit(t.Context(), "sku:1", []byte("set 5")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the job is running (held)", func() bool {
		st, err := keylane.Inspect(t.Context(), c.js, c.ns)
		if err != nil {
			return false
		}
		for _, p := range st.Partition {
			if p.InFlight > 0 {
				return true
			}
		}
		return false
	})
	if err := w.signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the worker says it drains", func() bool {
		b, _ := os.ReadFile(w.stderr)
		return strings.Contains(string(b), `"msg":"stopping: signal received, draining"`)
	})
	if w.waitExit(time.Second) {
		t.Fatalf("the worker exited during a drain that waits for a held job: %v\n%s", w.exitErr, tail(w.stderr, 20))
	}
	if err := w.signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !w.waitExit(30 * time.Second) {
		t.Fatalf("the worker did not exit after a second SIGINT\n%s", tail(w.stderr, 20))
	}
	var exit *exec.ExitError
	if !errors.As(w.exitErr, &exit) || exit.ExitCode() != cmdutil.ForcedExit {
		t.Fatalf("exit after a second SIGINT: %v, want status %d", w.exitErr, cmdutil.ForcedExit)
	}
	raw, err := os.ReadFile(w.stderr)
	if err != nil {
		t.Fatal(err)
	}
	said := false
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil || entry["msg"] == nil || entry["level"] == nil || entry["time"] == nil {
			t.Errorf("--log-format json wrote a line that is no JSON log entry: %s", line)
			continue
		}
		if strings.HasPrefix(entry["msg"].(string), "second signal while stopping") && entry["level"] == "ERROR" && entry["signal"] == "interrupt" {
			said = true
		}
	}
	if !said {
		t.Errorf("no ERROR line says the second signal ended the drain:\n%s", raw)
	}
}
