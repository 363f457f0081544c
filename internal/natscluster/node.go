package natscluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// Bounds of the waits a Node does on its own.
const (
	// exitWait bounds the wait for a process to die of SIGKILL.
	exitWait = 10 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
	stopGrace = 15 * time.Second
	// readyWait bounds the wait for a started process to accept clients.
	readyWait = 30 * time.Second
)

// ErrNotRunning is returned for a signal to a node whose process has
// exited (Kill or Stop without Restart, or a crash).
var ErrNotRunning = errors.New("natscluster: node not running")

// Node is one nats-server process of a Cluster. It keeps its ports, its
// configuration and its store across restarts. Its methods are safe for
// concurrent use.
type Node struct {
	index      int
	name       string
	bin        string
	dir        string // configuration, store and log
	conf, log  string
	clientPort int
	routePort  int
	httpPort   int

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when the current process has exited
	paused bool
}

// Name is the node's server name, as cluster info reports leaders.
func (n *Node) Name() string { return n.name }

// Index is the node's position in the cluster, 0 to Nodes-1.
func (n *Node) Index() int { return n.index }

// URL is the node's client URL.
func (n *Node) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.clientPort) }

// MonitorURL is the base URL of the node's monitoring endpoint (/jsz,
// /healthz, /varz).
func (n *Node) MonitorURL() string { return "http://127.0.0.1:" + strconv.Itoa(n.httpPort) }

// Log is the path of the node's log file; restarts append to it.
func (n *Node) Log() string { return n.log }

// StoreDir is the node's JetStream store directory.
func (n *Node) StoreDir() string { return n.dir + "/jetstream" }

// Running reports whether the node's process is alive (paused or not).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runningLocked()
}

// PID is the node's process ID, or 0 when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return 0
	}
	return n.cmd.Process.Pid
}

func (n *Node) runningLocked() bool {
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Paused reports whether the node is stopped by Pause.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused && n.runningLocked()
}

// start runs a new process on the node's configuration. The caller waits
// for it with waitReady.
func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runningLocked() {
		return fmt.Errorf("natscluster: %s already running", n.name)
	}
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "==== natscluster: starting %s at %s\n", n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(n.bin, "-c", n.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("natscluster: start %s: %w", n.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	n.cmd, n.done, n.paused = cmd, done, false
	return nil
}

// waitReady waits until the node accepts a client connection, and fails
// at once if its process exits.
func (n *Node) waitReady(ctx context.Context) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	var lastErr error
	for {
		nc, err := nats.Connect(n.URL(), nats.Timeout(time.Second), nats.NoReconnect())
		if err == nil {
			nc.Close()
			return nil
		}
		lastErr = err
		select {
		case <-done:
			return fmt.Errorf("natscluster: %s exited while starting: %s", n.name, n.tail(15))
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("natscluster: %s not accepting clients: %w", n.name, lastErr), ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling with a deadline
		}
	}
}

// signal sends sig to the running process.
func (n *Node) signal(sig syscall.Signal) (done chan struct{}, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, n.name)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return nil, fmt.Errorf("natscluster: %s %s: %w", sig, n.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		n.paused = true
	case syscall.SIGCONT:
		n.paused = false
	}
	return n.done, nil
}

func waitClosed(done chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Kill sends SIGKILL and waits for the process to exit: a crash, with
// whatever the store had not synced lost.
func (n *Node) Kill() error {
	done, err := n.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	if !waitClosed(done, exitWait) {
		return fmt.Errorf("natscluster: %s still running %s after SIGKILL", n.name, exitWait)
	}
	return nil
}

// Stop resumes the node if it is paused, sends SIGTERM and waits for the
// process to exit; after 15s it kills it and says so in the error.
func (n *Node) Stop() error {
	if _, err := n.signal(syscall.SIGCONT); err != nil {
		return err
	}
	done, err := n.signal(syscall.SIGTERM)
	if err != nil {
		return err
	}
	if waitClosed(done, stopGrace) {
		return nil
	}
	kerr := n.Kill()
	return errors.Join(fmt.Errorf("natscluster: %s ignored SIGTERM for %s; killed", n.name, stopGrace), kerr)
}

// Restart stops the node if it is running (Stop), starts it again on the
// same ports and store, and waits until it accepts client connections. It
// does not wait for the node to catch up with the cluster: use
// Cluster.WaitHealthy for that.
func (n *Node) Restart(ctx context.Context) error {
	if n.Running() {
		if err := n.Stop(); err != nil {
			return err
		}
	}
	if err := n.start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	return n.waitReady(ctx)
}

// Pause stops the process with SIGSTOP: it holds its connections and
// answers nothing, like a node in a long GC pause or on a frozen VM.
func (n *Node) Pause() error {
	_, err := n.signal(syscall.SIGSTOP)
	return err
}

// Resume continues a paused process with SIGCONT.
func (n *Node) Resume() error {
	_, err := n.signal(syscall.SIGCONT)
	return err
}

// tail returns the last lines of the node's log.
func (n *Node) tail(lines int) string {
	b, err := os.ReadFile(n.log)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// kill ends the process for good at clean-up: SIGKILL, and a wait.
func (n *Node) kill() {
	n.mu.Lock()
	running := n.runningLocked()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if !running {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}
