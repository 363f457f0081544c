// Package proctest runs the commands a test builds as real processes: it
// builds them, starts them with their output captured, and stops them
// when the test ends (SIGTERM, then SIGKILL past a deadline), logging
// what they wrote. Tests across processes (pg/cmd/keylane-pg's,
// statuspage/consoletest's) share it instead of each keeping its own.
package proctest

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Buffer is an output sink other goroutines write while the test reads
// it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Build builds the main package in dir (go build) into a temporary
// directory and returns the binary's path.
func Build(t testing.TB, dir, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// Proc is a process a test started.
type Proc struct {
	Cmd *exec.Cmd
	// Out is its stdout and stderr together.
	Out  *Buffer
	done chan struct{}
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Start runs bin with args. It dies with the test process (SIGKILL when
// the test binary dies, on Linux), and when the test ends it is sent
// SIGTERM and waited for a minute (then killed, and the test fails: a
// command that does not stop on SIGTERM is a bug); its output is logged.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Cmd: exec.Command(bin, args...), Out: &Buffer{}, done: make(chan struct{})}
	p.Cmd.Stdout, p.Cmd.Stderr = p.Out, p.Out
	p.Cmd.SysProcAttr = deathSignal()
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Stop(t, time.Minute)
		t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), p.Out.String())
	})
	return p
}

// Stop sends SIGTERM and waits up to within for the process to exit;
// past it the process is killed and the test fails.
func (p *Proc) Stop(t testing.TB, within time.Duration) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(within):
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop on SIGTERM within %v", p.Cmd.Path, within)
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s did not exit within 30s of SIGKILL", p.Cmd.Path)
	}
}
