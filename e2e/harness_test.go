package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	partitions = 8
	leaseTTL   = 2 * time.Second
	// stopGrace is how long Cleanup waits for a SIGTERM before SIGKILL.
	stopGrace = 5 * time.Second
)

// cluster is one namespace on the shared server, its worker processes, a
// client in the test process and a watch on the namespace's lease bucket.
type cluster struct {
	t     *testing.T
	ns    string
	names keylane.Names
	dir   string
	args  []string // extra worker flags

	nc     *nats.Conn
	js     jetstream.JetStream
	client *keylane.Client
	leases *leaseLog

	mu      sync.Mutex
	workers []*workerProc
}

// workerProc is one worker process.
type workerProc struct {
	id                   string
	cmd                  *exec.Cmd
	trace, stats, stderr string

	done     chan struct{} // closed once the process has exited
	exitErr  error         // valid after done
	exitedAt time.Time     // valid after done
}

// startCluster starts n workers in namespace ns with the common flags plus
// args, opens a client, and waits until the partitions are spread evenly
// over the workers (waitBalanced). Everything is stopped when the test ends.
func startCluster(t *testing.T, ns string, n int, args ...string) *cluster {
	t.Helper()
	c := clusterOn(t, natsURL, ns, args...)
	for i := range n {
		c.startWorker(fmt.Sprintf("%s-w%d", ns, i))
	}
	c.client = c.openClient()
	t.Cleanup(c.client.Close)
	c.leases = watchLeases(t, c.js, c.names)
	c.waitBalanced(30 * time.Second)
	return c
}

// wipe deletes what an earlier run (go test -count=N) left in the
// namespace: reused job IDs would otherwise be dropped as duplicates.
func (c *cluster) wipe() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range []string{c.names.Jobs(), c.names.Dead()} {
		if err := c.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			c.t.Fatal(err)
		}
	}
	for _, b := range []string{c.names.Leases(), c.names.Members(), c.names.Results(), c.names.State()} {
		if err := c.js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			c.t.Fatal(err)
		}
	}
}

// startWorker starts one worker process with the given ID.
func (c *cluster) startWorker(id string) *workerProc {
	c.t.Helper()
	w := &workerProc{
		id:     id,
		trace:  filepath.Join(c.dir, id+".trace"),
		stats:  filepath.Join(c.dir, id+".stats.json"),
		stderr: filepath.Join(c.dir, id+".stderr"),
		done:   make(chan struct{}),
	}
	args := []string{
		"--nats", natsURL, "--namespace", c.ns, "--partitions", strconv.Itoa(partitions),
		"--lease-ttl", leaseTTL.String(), "--trace", w.trace, "--stats", w.stats,
		"--id", id, "--log-level", "info", "--drain", "10s",
	}
	args = append(args, c.args...)
	errf, err := os.Create(w.stderr)
	if err != nil {
		c.t.Fatal(err)
	}
	w.cmd = exec.Command(workerBin, args...)
	w.cmd.Stdout = errf
	w.cmd.Stderr = errf
	if err := w.cmd.Start(); err != nil {
		errf.Close()
		c.t.Fatalf("start worker %s: %v", id, err)
	}
	go func() {
		err := w.cmd.Wait()
		errf.Close()
		w.exitErr, w.exitedAt = err, time.Now()
		close(w.done)
	}()
	c.mu.Lock()
	c.workers = append(c.workers, w)
	c.mu.Unlock()
	return w
}

func (w *workerProc) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *workerProc) signal(sig syscall.Signal) error { return w.cmd.Process.Signal(sig) }

// waitExit waits up to d for the process to exit and reports whether it did.
func (w *workerProc) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
		return false
	}
}

// stop sends SIGTERM and waits for the graceful exit; it returns the exit
// error and how long the exit took after the signal.
func (c *cluster) stop(w *workerProc, within time.Duration) (time.Duration, error) {
	c.t.Helper()
	sent := time.Now()
	if err := w.signal(syscall.SIGTERM); err != nil {
		c.t.Fatalf("SIGTERM %s: %v", w.id, err)
	}
	if !w.waitExit(within) {
		c.t.Fatalf("worker %s did not exit within %s of SIGTERM", w.id, within)
	}
	return w.exitedAt.Sub(sent), w.exitErr
}

// stopGraceful sends SIGTERM to every live worker at once and checks that
// each exits cleanly within d.
func (c *cluster) stopGraceful(d time.Duration) {
	c.t.Helper()
	c.mu.Lock()
	ws := slices.Clone(c.workers)
	c.mu.Unlock()
	var live []*workerProc
	for _, w := range ws {
		if !w.exited() {
			_ = w.signal(syscall.SIGTERM)
			live = append(live, w)
		}
	}
	for _, w := range live {
		if !w.waitExit(d) {
			c.t.Errorf("worker %s did not exit within %s of SIGTERM", w.id, d)
		} else if w.exitErr != nil {
			c.t.Errorf("worker %s: %v\n%s", w.id, w.exitErr, tail(w.stderr, 20))
		}
	}
}

// stopAll ends every process still running: SIGCONT (a stopped process
// cannot handle SIGTERM), SIGTERM, and SIGKILL after stopGrace. On failure
// it prints the tail of every worker's log.
func (c *cluster) stopAll() {
	c.mu.Lock()
	ws := slices.Clone(c.workers)
	c.mu.Unlock()
	for _, w := range ws {
		if !w.exited() {
			_ = w.signal(syscall.SIGCONT)
			_ = w.signal(syscall.SIGTERM)
		}
	}
	for _, w := range ws {
		if !w.waitExit(stopGrace) {
			c.t.Logf("worker %s ignored SIGTERM for %s; killing it", w.id, stopGrace)
			_ = w.signal(syscall.SIGKILL)
			<-w.done
		}
	}
	if c.t.Failed() {
		for _, w := range ws {
			c.t.Logf("---- %s (exit: %v), last lines of its log:\n%s", w.id, w.exitErr, tail(w.stderr, 40))
		}
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// live returns the IDs of the workers whose processes have not exited.
func (c *cluster) live() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, w := range c.workers {
		if !w.exited() {
			ids = append(ids, w.id)
		}
	}
	return ids
}

func (c *cluster) worker(i int) *workerProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.workers[i]
}

func (c *cluster) traceFiles() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var fs []string
	for _, w := range c.workers {
		fs = append(fs, w.trace)
	}
	return fs
}

// batches reports whether the cluster's jobs travel in batch messages:
// always, since every job does (one wire path); the loads still mix jobs
// with and without a caller's ID.
func (c *cluster) batches() bool { return true }

// openClient polls until the first worker has created the namespace. A
// try that runs out of its 5 s is tried again: on a loaded machine a
// cluster that is still placing the workers' consumers can leave one
// JetStream API request unanswered (a CI run lost one so while the
// workers started, and failed the test on the first try).
func (c *cluster) openClient() *keylane.Client {
	c.t.Helper()
	var cl *keylane.Client
	testwait.NoError(c.t, 60*time.Second, "open client on "+c.ns, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		cl, err = keylane.NewClient(ctx, c.nc, keylane.ClientConfig{Namespace: c.ns})
		if err != nil && !errors.Is(err, keylane.ErrNoTopology) && !errors.Is(err, context.DeadlineExceeded) {
			return testwait.Stop(err)
		}
		return err
	})
	if cl.Partitions() != partitions {
		c.t.Fatalf("client sees %d partitions, want %d", cl.Partitions(), partitions)
	}
	return cl
}

// balanced reports why holders (partition → lease holder) is not the
// resting state of balancing among members, or "" when it is: every
// partition held by a member, each member holding floor or ceil of
// partitions/W, so that partition.Assign moves nothing.
func balanced(holders map[int]string, members []string) string {
	w := len(members)
	if w == 0 {
		return "no live worker"
	}
	current := make([]string, partitions)
	per := map[string]int{}
	for p := range partitions {
		h := holders[p]
		if !slices.Contains(members, h) {
			return fmt.Sprintf("partition %d held by %q, not a live worker", p, h)
		}
		current[p] = h
		per[h]++
	}
	for _, m := range members {
		if per[m] < partitions/w || per[m] > (partitions+w-1)/w {
			return fmt.Sprintf("%s holds %d partitions, want %d..%d", m, per[m], partitions/w, (partitions+w-1)/w)
		}
	}
	if want := partition.Assign(partitions, members, current, nil); !slices.Equal(want, current) {
		return fmt.Sprintf("balancing would move partitions to %v", want)
	}
	return ""
}

// waitBalanced waits until the partitions are spread evenly over the live
// workers (balanced), as read from the lease bucket itself
// (leaseHolders), not from the test's watch on it.
func (c *cluster) waitBalanced(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		live := c.live()
		got, err := c.leaseHolders()
		why := fmt.Sprint("read error: ", err)
		if err == nil {
			why = balanced(got, live)
			if why == "" {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("partitions not balanced over %v within %s (%s): holders in the bucket %v, as the test's watch saw them %v",
				live, timeout, why, got, c.leases.holders())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leaseHolders reads every partition's lease entry from the bucket now. A
// watch can be wrong where this is not: a server that restarts expires
// entries while it recovers its store without writing an expiry marker, so
// a watcher never hears that a dead worker's leases are gone; and a watch
// whose ordered consumer is lost in a restart stops seeing changes at all.
func (c *cluster) leaseHolders() (map[int]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, c.names.Leases())
	if err != nil {
		return nil, err
	}
	m := make(map[int]string, partitions)
	for p := range partitions {
		e, err := kv.Get(ctx, "p."+strconv.Itoa(p))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // free (deleted, purged or expired)
		}
		if err != nil {
			return m, fmt.Errorf("lease of partition %d: %w", p, err)
		}
		info, err := lease.Decode(e.Value())
		if err != nil {
			return m, fmt.Errorf("lease of partition %d: %w", p, err)
		}
		m[p] = info.Holder
	}
	return m, nil
}

// ownedBy returns the partitions w holds now.
func (c *cluster) ownedBy(id string) []int {
	var ps []int
	for p, h := range c.leases.holders() {
		if h == id {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// readStats reads a worker's final counters (written when it exits
// gracefully).
func readStats(t *testing.T, w *workerProc) keylane.Stats {
	t.Helper()
	b, err := os.ReadFile(w.stats)
	if err != nil {
		t.Fatalf("stats of %s: %v", w.id, err)
	}
	var s keylane.Stats
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("stats of %s: %v (%s)", w.id, err, b)
	}
	return s
}

// leaseEvent is one change of a lease entry as a watcher in the test saw it.
type leaseEvent struct {
	at     time.Time
	p      int
	holder string // "" for a delete or expiry
	rev    uint64
}

// leaseLog records every change of the lease bucket from the moment the
// test starts watching.
type leaseLog struct {
	mu     sync.Mutex
	events []leaseEvent
	cur    map[int]string
}

func watchLeases(t *testing.T, js jetstream.JetStream, names keylane.Names) *leaseLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// The client can open the jobs stream before the first worker's Setup
	// has made the buckets.
	var kv jetstream.KeyValue
	err := testwait.Poll(30*time.Second, func() error {
		var err error
		kv, err = js.KeyValue(ctx, names.Leases())
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return testwait.Stop(err)
		}
		return err
	})
	if err != nil {
		cancel()
		t.Fatalf("lease bucket %s: %v", names.Leases(), err)
	}
	kw, err := kv.WatchAll(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &leaseLog{cur: map[int]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			p, err := strconv.Atoi(strings.TrimPrefix(e.Key(), "p."))
			if err != nil {
				continue
			}
			ev := leaseEvent{at: time.Now(), p: p, rev: e.Revision()}
			if e.Operation() == jetstream.KeyValuePut {
				if info, err := lease.Decode(e.Value()); err == nil {
					ev.holder = info.Holder
				}
			}
			l.mu.Lock()
			l.events = append(l.events, ev)
			l.cur[p] = ev.holder
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = kw.Stop()
		cancel()
		<-done
	})
	return l
}

func (l *leaseLog) holders() map[int]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]string, len(l.cur))
	for p, h := range l.cur {
		if h != "" {
			m[p] = h
		}
	}
	return m
}

// takenOver returns, for each partition in ps, the first time after since at
// which a holder other than old put its lease, and whether all of ps have
// been taken.
func (l *leaseLog) takenOver(ps []int, old string, since time.Time) (map[int]time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := map[int]time.Time{}
	for _, e := range l.events {
		if e.at.Before(since) || e.holder == "" || e.holder == old || !slices.Contains(ps, e.p) {
			continue
		}
		if _, ok := got[e.p]; !ok {
			got[e.p] = e.at
		}
	}
	return got, len(got) == len(ps)
}

// waitTakenOver waits until every partition in ps was acquired by a worker
// other than old after since, and returns the time of the last acquisition.
func (c *cluster) waitTakenOver(ps []int, old string, since time.Time, timeout time.Duration) time.Time {
	c.t.Helper()
	// What a failure shows: the take-overs so far and who holds what now.
	type progress struct {
		Taken   map[int]time.Time
		Holders map[int]string
	}
	seen := testwait.Until(c.t, timeout, fmt.Sprintf("partitions %v of %s taken over", ps, old), func() (progress, bool) {
		got, all := c.leases.takenOver(ps, old, since)
		return progress{got, c.leases.holders()}, all
	})
	var last time.Time
	for p, at := range seen.Taken {
		c.t.Logf("partition %d taken over by %s after %s", p, seen.Holders[p], at.Sub(since).Round(time.Millisecond))
		if at.After(last) {
			last = at
		}
	}
	return last
}

// deadLetters reads every message of the namespace's dead-letter stream.
func (c *cluster) deadLetters() []*jetstream.RawStreamMsg {
	c.t.Helper()
	return natstest.StreamMsgs(c.t, c.js, c.names.Dead())
}

// waitDeadLetter polls the dead-letter stream until match finds a message.
func (c *cluster) waitDeadLetter(timeout time.Duration, what string, match func(*jetstream.RawStreamMsg) bool) *jetstream.RawStreamMsg {
	c.t.Helper()
	return testwait.Until(c.t, timeout, "a dead letter for "+what, func() (*jetstream.RawStreamMsg, bool) {
		for _, m := range c.deadLetters() {
			if match(m) {
				return m, true
			}
		}
		return nil, false
	})
}

// jobsLastSeq is the jobs stream's last sequence: it moves only when a job
// is stored.
func (c *cluster) jobsLastSeq() uint64 {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, c.names.Jobs())
	if err != nil {
		c.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return info.State.LastSeq
}

// call runs one command with a bounded wait.
func (c *cluster) call(key, payload string, opts ...keylane.SubmitOpt) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.client.Call(ctx, key, []byte(payload), opts...)
	return string(res), err
}

// mustCall runs a command and fails the test on an error.
func (c *cluster) mustCall(key, payload string, opts ...keylane.SubmitOpt) string {
	c.t.Helper()
	res, err := c.call(key, payload, opts...)
	if err != nil {
		c.t.Fatalf("%s %q: %v", key, payload, err)
	}
	return res
}

// stock reads a SKU's stock with "get".
func (c *cluster) stock(sku string) int64 {
	c.t.Helper()
	res := c.mustCall(sku, "get")
	n, ok := strings.CutPrefix(res, "stock ")
	if !ok {
		c.t.Fatalf("get %s: unexpected reply %q", sku, res)
	}
	v, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		c.t.Fatalf("get %s: %v", sku, err)
	}
	return v
}

// setStock sets every SKU's stock.
func (c *cluster) setStock(skus []string, stock []int64) {
	c.t.Helper()
	for i, s := range skus {
		want := "ok " + strconv.FormatInt(stock[i], 10)
		if res := c.mustCall(s, "set "+strconv.FormatInt(stock[i], 10)); res != want {
			c.t.Fatalf("set %s: got %q, want %q", s, res, want)
		}
	}
}

// requireAlive fails the test if any worker process has exited.
func (c *cluster) requireAlive() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.workers {
		if w.exited() {
			c.t.Errorf("worker %s exited: %v\n%s", w.id, w.exitErr, tail(w.stderr, 20))
		}
	}
}

// logContains reports whether a worker's log has s in it.
func logContains(w *workerProc, s string) bool {
	b, err := os.ReadFile(w.stderr)
	return err == nil && bytes.Contains(b, []byte(s))
}
