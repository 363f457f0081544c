package embedded_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"
)

// holderDirEnv, when set, makes the test binary a child process that holds
// the store in that directory until it is killed.
const holderDirEnv = "KEYLANE_EMBEDDED_TEST_HOLD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holderDirEnv); dir != "" {
		os.Exit(hold(dir))
	}
	goleak.VerifyTestMain(m,
		// The in-process nats-server keeps a few process-wide goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func2"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ipQueue[...]).popOne"),
	)
}

// hold starts a server on dir, says "ready" on stdout and runs until the
// process is killed.
func hold(dir string) int {
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready")
	s.WaitForShutdown()
	return 0
}

func start(t *testing.T, dir string) (*server.Server, error) {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { stop(s) })
	return s, nil
}

func stop(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// wantInUse fails the test unless err says the store in dir is in use.
func wantInUse(t *testing.T, err error, dir string) {
	t.Helper()
	if err == nil {
		t.Fatalf("a second server started on the store in %s, which another server holds", dir)
	}
	if !errors.Is(err, embedded.ErrStoreInUse) {
		t.Fatalf("error %q is not ErrStoreInUse", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Fatalf("error %q does not name the directory %s", err, dir)
	}
	t.Logf("refused: %v", err)
}

// Two servers on one store would each think they own its files: the second
// start must be refused while the first runs, and allowed once it stopped.
func TestStartRefusesStoreInUse(t *testing.T) {
	dir := t.TempDir()
	first, err := start(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = start(t, dir)
	wantInUse(t, err, dir)

	stop(first)
	if _, err := start(t, dir); err != nil {
		t.Fatalf("start after the holder shut down: %v", err)
	}
}

// Another process holding the store refuses the start too, and a holder
// that is killed (no shutdown at all) does not leave the store locked.
func TestStartRefusesStoreInUseByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case line := <-lines:
		if line != "ready" {
			t.Fatalf("holder process: %q", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("holder process not ready within 30s")
	}

	_, err = start(t, dir)
	wantInUse(t, err, dir)

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	exited = true
	if _, err := start(t, dir); err != nil {
		t.Fatalf("start after the holder process was killed: %v", err)
	}
}

// A port another process listens on is refused at once, naming the
// address, instead of a "not ready" after the whole ReadyTimeout: the
// test tells the two apart by half the ReadyTimeout, not by speed.
func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	start := time.Now()
	s, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: port, StoreDir: t.TempDir(), ReadyTimeout: 20 * time.Second})
	took := time.Since(start)
	if err == nil {
		s.Shutdown()
		s.WaitForShutdown()
		t.Fatalf("Start on a taken port succeeded")
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "in use") || took > 10*time.Second {
		t.Fatalf("Start on taken %s: %v after %s; want an error naming the address and \"in use\", at once", addr, err, took)
	}
	if !errors.Is(err, embedded.ErrAddrInUse) {
		t.Fatalf("err = %v; want errors.Is ErrAddrInUse", err)
	}
}
