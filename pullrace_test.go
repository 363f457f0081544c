package keylane

import (
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/testwait"
)

// TestSmallWindowKeepsPulling: a worker whose window is one job
// (MaxInFlight 1) works through a stored backlog on a busy machine
// (processes spinning beside it, as a loaded CI machine has) without a
// single re-synchronisation. nats.go v1.55.0's pull iterator skips the
// next pull when the goroutine that sent the last one has not yet marked
// it sent: with a pull batch of one and a backlog, the job that pull
// brought arrives and is taken at once, the iterator finds nothing
// pending and a pull "in progress", and sends nothing until its
// missed-heartbeat error 5 s later, which keylane read as a broken
// delivery and re-synchronised from the ack floor. Bounded: 400 jobs,
// within a minute.
func TestSmallWindowKeepsPulling(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var done atomic.Int64
	w := e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		done.Add(1)
		return nil, nil
	}), func(c *WorkerConfig) { c.MaxInFlight, c.Concurrency = 1, 1 })
	e.waitOwned(w)

	// Processes that spin beside the test, as other jobs do on a loaded
	// machine: the OS, not Go's scheduler, takes a thread away between
	// two statements of a goroutine. Each ends after 60 s by itself, so a
	// test binary killed before its cleanup leaves none spinning.
	for range runtime.NumCPU() {
		hog := exec.Command("timeout", "60", "sh", "-c", "while :; do :; done")
		hog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the kill reaches timeout's child too
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-hog.Process.Pid, syscall.SIGKILL); _ = hog.Wait() })
	}

	const jobs = 400
	reqs := make([]Request, jobs)
	for i := range reqs {
		reqs[i] = Request{Key: "k" + strconv.Itoa(i%7), Payload: []byte(strconv.Itoa(i))}
	}
	start := time.Now()
	e.submitAll(reqs)
	deadline := time.Now().Add(time.Minute)
	for done.Load() < jobs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s := w.Stats()
	t.Logf("%d of %d jobs in %s, stats %+v", done.Load(), jobs, time.Since(start).Round(time.Millisecond), s)
	if done.Load() < jobs || s.Resyncs != 0 {
		t.Errorf("%d of %d jobs run, %d re-synchronisations: the worker stopped pulling (want every job, none)", done.Load(), jobs, s.Resyncs)
	}
}

// TestMissedHeartbeatsStillResync: the pull nudge (pullNudge) must not
// blind the worker to a pull that went nowhere. The worker's connection
// goes silent downstream (a fault proxy drops what the server sends,
// the connection stays open, the lease's TTL outlasts the silence): its
// pull's heartbeats stop, and within two of them (5 s) the worker must
// re-synchronise, saying it missed heartbeats; once the connection
// speaks again its calls are answered. A nudge that returned from every
// Next would restart nats.go's heartbeat watch each time, and the worker
// would wait with no pull out for as long as the silence lasted: the
// re-synchronisation never came when fetch looped on short Nexts.
func TestMissedHeartbeatsStillResync(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, LeaseTTL: 30 * time.Second})
	var logs syncBuffer
	nc, p := proxiedConn(t, e.srv.ClientURL())
	w := startWorker(t, nc, WorkerConfig{Topology: e.topo.Config, ID: "w", AckWait: 5 * time.Second,
		Handler: HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) { return job.Payload, nil }),
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	e.waitOwned(w)
	if res, err := e.client.Call(ctx(t), "k", []byte("before")); err != nil || string(res) != "before" {
		t.Fatalf("call before the silence = %q, %v", res, err)
	}
	silence, err := p.Timeout(faultproxy.Downstream, 0)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 15*time.Second, "a re-synchronisation on missed heartbeats", func() bool { return w.Stats().Resyncs > 0 })
	silence.Remove()
	// The owner counts a re-synchronisation just before it logs why: on a
	// loaded machine the test can read the logs in between.
	if testwait.Poll(5*time.Second, func() error {
		if !strings.Contains(logs.String(), "heartbeat") {
			return errors.New("not yet")
		}
		return nil
	}) != nil {
		t.Errorf("the re-synchronisation does not say it missed heartbeats:\n%s", logs.String())
	}
	cctx, cancel := context.WithTimeout(ctx(t), 30*time.Second)
	defer cancel()
	if res, err := e.client.Call(cctx, "k", []byte("after")); err != nil || string(res) != "after" {
		t.Fatalf("call after the silence = %q, %v; stats %+v", res, err, w.Stats())
	}
}
