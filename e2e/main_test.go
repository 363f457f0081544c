// Package e2e tests keylane across processes: worker processes built from
// ./e2e/testworker (cmd/worker with the test-only flags) run against one
// NATS server that lives in the test process, and the tests drive them
// through a keylane Client, kill, pause and stop them, and check the
// invariants on what came back, on the final state and on the workers'
// trace files.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/keylane/keylane/embedded"
	"go.uber.org/goleak"
)

var (
	// workerBin is the worker binary built by TestMain (without -race: the
	// workers are the system under test, the race detector runs in the
	// test process).
	workerBin string
	// natsURL is the in-process server every test shares; tests keep apart
	// by namespace.
	natsURL string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "keylane-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	workerBin = filepath.Join(tmp, "worker")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(goBin, "build", "-o", workerBin, "github.com/keylane/keylane/e2e/testworker")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the worker: %v\n%s", err, out)
		return 1
	}

	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: filepath.Join(tmp, "jetstream"), ServerName: "keylane-e2e"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	natsURL = s.ClientURL()

	code := m.Run()

	s.Shutdown()
	s.WaitForShutdown()
	if code == 0 {
		// Every test closes its connections, watchers and process waiters;
		// what is left running here leaked.
		if err := goleak.Find(toxiproxyStuckPipe); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: goroutine leak:", err)
			return 1
		}
	}
	return code
}

// toxiproxyStuckPipe ignores a goroutine toxiproxy v2.5.0 leaves behind
// when a proxied peer dies while the other side still sends (a SIGKILLed
// worker, a cut): the link's writer stops at the write error without
// draining its output channel (link.go, ToxicLink.write), so the toxic
// that feeds it (noop, latency, timeout: any toxic's Pipe under
// ToxicStub.Run) blocks for good on one chunk. It is toxiproxy's, holds at
// most one chunk, and nothing of ours can reach it; the link's other
// goroutines and the proxy's listener do exit, so a proxy left open is
// still reported.
var toxiproxyStuckPipe = goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run")
