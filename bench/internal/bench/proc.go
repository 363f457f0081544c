package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a process the bench started: a worker, a raw JetStream
// consumer or a nats-server. Its output goes to a bounded buffer that is
// quoted when it fails.
type child struct {
	cmd    *exec.Cmd
	done   chan struct{}
	out    *tail
	stdin  io.WriteCloser
	allocs chan uint64 // answers to "allocs" on stdin (our own Go children)
}

// startChild runs name with args and, when ready is not empty, waits until
// the child prints a line equal to it on stdout.
func startChild(ctx context.Context, ready string, name string, args ...string) (*child, error) {
	c := &child{cmd: exec.Command(name, args...), done: make(chan struct{}), out: &tail{max: 4096}, allocs: make(chan uint64, 1)}
	c.cmd.Stderr = c.out
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if ready != "" { // one of the bench's own children: it answers allocation queries
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	seen := make(chan struct{})
	go func() {
		defer close(c.done)
		want := ready
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if want != "" && sc.Text() == want {
				close(seen)
				want = ""
				continue
			}
			if v, ok := strings.CutPrefix(sc.Text(), allocsAnswer); ok {
				if n, err := strconv.ParseUint(v, 10, 64); err == nil {
					select {
					case c.allocs <- n:
					default:
					}
				}
				continue
			}
			fmt.Fprintln(c.out, sc.Text())
		}
		_ = c.cmd.Wait()
	}()
	if ready == "" {
		return c, nil
	}
	select {
	case <-seen:
		probes.Store(c.pid(), c.mallocs)
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("%s exited before it was ready: %s", name, c.out)
	case <-ctx.Done():
		c.stop(time.Second)
		return nil, errors.Join(fmt.Errorf("%s not ready", name), ctx.Err())
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// mallocs asks the child how many heap objects it has allocated so far
// (runtime.MemStats.Mallocs); false when it does not answer in time.
func (c *child) mallocs() (uint64, bool) {
	if c.stdin == nil {
		return 0, false
	}
	select { // drop a late answer to an earlier query
	case <-c.allocs:
	default:
	}
	if _, err := io.WriteString(c.stdin, allocsQuery+"\n"); err != nil {
		return 0, false
	}
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case n := <-c.allocs:
		return n, true
	case <-c.done:
	case <-t.C:
	}
	return 0, false
}

// The allocation query the bench's children answer on stdin/stdout.
const (
	allocsQuery  = "allocs"
	allocsAnswer = "allocs "
)

// AnswerAllocs answers each "allocs" line read from in with "allocs N" on
// out, N being the process's heap allocations so far. The hidden worker
// and rawjs subcommands run it on stdin, so the bench can report
// allocations per job of its child processes.
func AnswerAllocs(in io.Reader, out io.Writer) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if sc.Text() == allocsQuery {
			fmt.Fprintf(out, "%s%d\n", allocsAnswer, selfMallocs())
		}
	}
}

func selfMallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// probes maps a measured pid to how to read its allocations: the bench's
// own children register here; the bench process reads its own.
var probes sync.Map // int → func() (uint64, bool)

func allocsOf(pid int) (uint64, bool) {
	if pid == os.Getpid() {
		return selfMallocs(), true
	}
	if f, ok := probes.Load(pid); ok {
		return f.(func() (uint64, bool))()
	}
	return 0, false
}

// stop sends SIGTERM and waits up to grace for the exit, then kills.
func (c *child) stop(grace time.Duration) {
	probes.Delete(c.pid())
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// tail keeps the last max bytes written to it. It is safe for concurrent
// use.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// usage is what a process used in a timed window.
type usage struct {
	CPU       time.Duration // user + system time
	RSS       int64         // peak resident set in bytes, sampled
	Allocs    uint64        // heap allocations (Go processes of the bench's own)
	HasAllocs bool
}

// meter measures processes over a timed window: CPU from /proc/<pid>/stat
// at both ends, RSS from /proc/<pid>/status sampled every 50 ms.
type meter struct {
	pids    []int // 0: not measured
	cpu0    []time.Duration
	allocs0 []uint64
	hasA    []bool
	peak    []int64
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
}

func startMeter(pids ...int) *meter {
	m := &meter{pids: pids, cpu0: make([]time.Duration, len(pids)), peak: make([]int64, len(pids)), stop: make(chan struct{}),
		allocs0: make([]uint64, len(pids)), hasA: make([]bool, len(pids))}
	for i, p := range pids {
		if p != 0 {
			m.allocs0[i], m.hasA[i] = allocsOf(p)
			m.cpu0[i], _ = procCPU(p)
		}
	}
	m.sample()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				m.sample()
			}
		}
	}()
	return m
}

func (m *meter) sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, p := range m.pids {
		if p == 0 {
			continue
		}
		if rss, err := procRSS(p); err == nil {
			m.peak[i] = max(m.peak[i], rss)
		}
	}
}

// end stops the meter and returns each process's usage, in the order the
// pids were given.
func (m *meter) end() []usage {
	m.sample()
	close(m.stop)
	m.wg.Wait()
	out := make([]usage, len(m.pids))
	for i, p := range m.pids {
		if p == 0 {
			continue
		}
		cpu, _ := procCPU(p)
		out[i] = usage{CPU: cpu - m.cpu0[i], RSS: m.peak[i]}
		if m.hasA[i] {
			if a, ok := allocsOf(p); ok {
				out[i].Allocs, out[i].HasAllocs = a-m.allocs0[i], true
			}
		}
	}
	return out
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux platform Go supports.
const clockTick = 10 * time.Millisecond

// procCPU returns the user plus system time the process has used.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name in parentheses may hold spaces; fields count from
	// after its closing parenthesis, where field 3 (state) begins.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bench: bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("bench: short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * clockTick, nil
}

// procRSS returns the resident set size of the process in bytes.
func procRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseRSS(f)
}

func parseRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("bench: no VmRSS in /proc status")
}
