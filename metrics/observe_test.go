package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// families gathers reg, by metric family name.
func families(t *testing.T, reg prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// series finds the series of family name whose labels include want.
func series(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mf := families(t, reg)[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		for k, v := range want {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// histogram returns the count and sum of a histogram series (0, 0 if it
// does not exist).
func histogram(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// value returns a counter's or gauge's value, NaN if the series does not
// exist.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := series(t, reg, name, labels)
	switch {
	case m == nil:
		return math.NaN()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	default:
		return m.GetGauge().GetValue()
	}
}

// deployment is a worker and a client on one in-process NATS server, both
// observed, with every collector on one registry.
type deployment struct {
	nc  *nats.Conn
	w   *keylane.Worker
	c   *keylane.Client
	reg *prometheus.Registry
	// runs counts a handler's runs, where the test counts them.
	runs *atomic.Int64
}

// start runs cfg's worker (Observer set here) and a client; with
// setupFirst the namespace is created before the worker starts, so jobs
// can be stored before any worker fetches.
func start(t *testing.T, cfg keylane.WorkerConfig, beforeWorker func(*deployment)) *deployment {
	t.Helper()
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx := t.Context()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keylane.Setup(ctx, js, cfg.Topology); err != nil {
		t.Fatal(err)
	}
	d := &deployment{nc: nc, reg: prometheus.NewRegistry()}
	wm, cm := NewWorker(), NewClient()
	d.c, err = keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: cfg.Topology.Namespace, Observer: cm.Observer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.c.Close)
	if beforeWorker != nil {
		beforeWorker(d)
	}
	cfg.Observer = wm.Observer()
	d.w, err = keylane.NewWorker(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.w.Stop(sctx)
	})
	ns := NewNamespace(js, cfg.Topology.Namespace)
	ns.every = 0 // read at every scrape
	d.reg.MustRegister(wm, cm, New(d.w), ns, Connected(nc, cfg.ID), BuildInfo())
	return d
}

var errFail = errors.New("told to fail")

// echo returns the payload, or a permanent error for "fail".
var echo = keylane.HandlerFunc(func(_ context.Context, j keylane.Job) ([]byte, error) {
	if string(j.Payload) == "fail" {
		return nil, keylane.Permanent(errFail)
	}
	return j.Payload, nil
})

// runHandlerJobs runs, through a Handler worker on 2 partitions: 5 Calls
// that succeed, 1 that is dead-lettered, 2 Submits and a third Submit of
// the second's ID, and a SubmitMany of 3. Every job travels in a batch
// message, so the third Submit is stored too (the server de-duplicates no
// job of a batch): the worker answers it from the second's kept outcome
// without running the handler. It returns once all 12 stored jobs are
// settled; d.runs counts the handler's runs.
func runHandlerJobs(t *testing.T) *deployment {
	t.Helper()
	runs := new(atomic.Int64)
	counted := keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
		runs.Add(1)
		return echo(ctx, j)
	})
	d := start(t, keylane.WorkerConfig{
		ID:       "h1",
		Topology: keylane.TopologyConfig{Namespace: "mh", Partitions: 2, LeaseTTL: time.Second},
		Handler:  counted,
	}, nil)
	d.runs = runs
	ctx := t.Context()
	for i := range 5 {
		if _, err := d.c.Call(ctx, fmt.Sprintf("k%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	var remote *keylane.RemoteError
	if _, err := d.c.Call(ctx, "k0", []byte("fail")); !errors.As(err, &remote) || !remote.DeadLettered {
		t.Fatalf("call of a failing job: %v, want a dead-lettered RemoteError", err)
	}
	for _, id := range []string{"s1", "s2", "s2"} {
		// The repeated ID is stored again and answered by the worker: no
		// ErrDuplicate on a namespace without a key backlog cap.
		if _, err := d.c.Submit(ctx, "k1", []byte("x"), keylane.WithID(id)); err != nil {
			t.Fatalf("submit of ID %s: %v", id, err)
		}
	}
	reqs := []keylane.Request{{Key: "a", Payload: []byte("x")}, {Key: "b", Payload: []byte("x")}, {Key: "c", Payload: []byte("x")}}
	if out, err := d.c.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	} else {
		for _, o := range out {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
		}
	}
	testwait.Eventually(t, 10*time.Second, "all jobs settled", func() bool {
		s := d.w.Stats()
		// The dead letter is counted before its ack: wait for the ack too.
		n, _ := histogram(t, d.reg, "keylane_job_end_to_end_seconds", nil)
		return s.Succeeded == 10 && s.DeadLettered == 1 && n >= 12
	})
	return d
}

func TestHandlerWorkerHistogramsCountEveryJob(t *testing.T) {
	d := runHandlerJobs(t)
	const (
		jobs   = 11       // 6 calls, 2 submits, 3 of SubmitMany: each run once
		stored = jobs + 1 // and the repeated ID's copy, answered from its kept outcome
	)
	if n := d.runs.Load(); n != jobs {
		t.Errorf("the handler ran %d times, want %d (once per job: the repeated ID's copy is not run)", n, jobs)
	}
	if n, _ := histogram(t, d.reg, "keylane_job_run_seconds", nil); n != jobs {
		t.Errorf("keylane_job_run_seconds has %d observations, want %d (one per handler run)", n, jobs)
	}
	for _, name := range []string{"keylane_job_queue_wait_seconds", "keylane_job_end_to_end_seconds"} {
		if n, _ := histogram(t, d.reg, name, nil); n != stored {
			t.Errorf("%s has %d observations, want %d (one per stored job: the repeated ID's copy waited and was answered too)", name, n, stored)
		}
	}
	if n, _ := histogram(t, d.reg, "keylane_group_jobs", nil); n != 0 {
		t.Errorf("a handler worker observed %d groups", n)
	}
	_, wait := histogram(t, d.reg, "keylane_job_queue_wait_seconds", nil)
	_, e2e := histogram(t, d.reg, "keylane_job_end_to_end_seconds", nil)
	if e2e < wait {
		t.Errorf("end-to-end latency sum %.6fs is below the queue wait sum %.6fs", e2e, wait)
	}

	client := []struct {
		op, outcome string
		want        float64
	}{
		{OpCall, OutcomeOK, 5}, {OpCall, OutcomeRemoteError, 1},
		{OpSubmit, OutcomeOK, 3}, {OpSubmit, OutcomeDuplicate, 0},
		{OpSubmitMany, OutcomeOK, 3}, {OpSubmitMany, OutcomeError, 0},
		{OpCall, OutcomeNoReply, 0},
	}
	for _, c := range client {
		if got := value(t, d.reg, "keylane_client_jobs_total", map[string]string{"op": c.op, "outcome": c.outcome}); got != c.want {
			t.Errorf("keylane_client_jobs_total{op=%q,outcome=%q} = %v, want %v", c.op, c.outcome, got, c.want)
		}
	}
	for op, want := range map[string]uint64{OpCall: 6, OpSubmit: 3, OpSubmitMany: 1} {
		if n, _ := histogram(t, d.reg, "keylane_client_request_seconds", map[string]string{"op": op}); n != want {
			t.Errorf("keylane_client_request_seconds{op=%q} has %d observations, want %d", op, n, want)
		}
	}

	// Leases: renewed every TTL/3, each renew measured; two partitions,
	// each trusted for at most TTL minus the safety margin.
	testwait.Eventually(t, 5*time.Second, "lease renews measured", func() bool {
		n, _ := histogram(t, d.reg, "keylane_lease_renew_seconds", nil)
		return n >= 3 // the member's lease and both partitions' renew every 333ms
	})
	if f := value(t, d.reg, "keylane_lease_renew_failures_total", nil); f != 0 {
		t.Errorf("%v renew failures on a healthy server", f)
	}
	for p := range 2 {
		labels := map[string]string{"partition": fmt.Sprint(p), "worker": "h1"}
		if v := value(t, d.reg, "keylane_lease_trusted_for_seconds", labels); !(v > 0 && v <= 0.9) {
			t.Errorf("partition %d trusted for %vs, want in (0, 0.9] (TTL 1s less the 10%% margin)", p, v)
		}
		for _, g := range []string{"keylane_partition_backlog", "keylane_partition_in_flight"} {
			if v := value(t, d.reg, g, labels); v != 0 {
				t.Errorf("%s{partition=%d} = %v once every job settled, want 0", g, p, v)
			}
		}
	}
}

func TestReducerWorkerGroupSizesAddUpToJobs(t *testing.T) {
	const jobs = 200
	counter := keylane.ReducerFunc(func(_ context.Context, j keylane.Job, state []byte) ([]byte, []byte, error) {
		return append(append([]byte(nil), state...), 'x'), nil, nil
	})
	// The jobs are stored before the worker starts, so each key's queue is
	// long when the worker fetches it: groups form.
	d := start(t, keylane.WorkerConfig{
		ID:       "r1",
		Topology: keylane.TopologyConfig{Namespace: "mr", Partitions: 1, LeaseTTL: time.Second},
		Reducer:  counter,
	}, func(d *deployment) {
		reqs := make([]keylane.Request, jobs)
		for i := range reqs {
			reqs[i] = keylane.Request{Key: fmt.Sprintf("sku:%d", i%4), Payload: []byte("+1")}
		}
		if _, err := d.c.SubmitMany(t.Context(), reqs); err != nil {
			t.Fatal(err)
		}
	})
	testwait.Eventually(t, 10*time.Second, "all jobs settled", func() bool { return d.w.Stats().Succeeded == jobs })
	groups, size := histogram(t, d.reg, "keylane_group_jobs", nil)
	if size != jobs {
		t.Errorf("group sizes add up to %v, want %d: every job was committed by exactly one group", size, jobs)
	}
	if groups == 0 || groups >= jobs {
		t.Errorf("%d groups for %d queued jobs: want fewer groups than jobs", groups, jobs)
	}
	if runs, _ := histogram(t, d.reg, "keylane_job_run_seconds", nil); runs != groups {
		t.Errorf("%d runs measured, want one per group (%d)", runs, groups)
	}
	for _, name := range []string{"keylane_job_queue_wait_seconds", "keylane_job_end_to_end_seconds"} {
		if n, _ := histogram(t, d.reg, name, nil); n != jobs {
			t.Errorf("%s has %d observations, want %d", name, n, jobs)
		}
	}
	if n := value(t, d.reg, "keylane_client_jobs_total", map[string]string{"op": OpSubmitMany, "outcome": OutcomeOK}); n != jobs {
		t.Errorf("client counted %v jobs of SubmitMany, want %d", n, jobs)
	}
}

// TestClientCountsDuplicates covers the "duplicate" outcome: on a
// namespace with a key backlog cap every job is a one-job message, which
// the server de-duplicates by its ID, so a second Submit of an ID within
// the duplicate window is refused with ErrDuplicate and stored once.
func TestClientCountsDuplicates(t *testing.T) {
	runs := new(atomic.Int64)
	gate := make(chan struct{})
	counted := keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
		runs.Add(1)
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echo(ctx, j)
	})
	// A key capped at one job: while s1 runs (stored until its ack), a
	// second Submit of s1 is refused over the cap, and the client, which
	// finds s1 queued, says ErrDuplicate: nothing new stored.
	d := start(t, keylane.WorkerConfig{
		ID:       "d1",
		Topology: keylane.TopologyConfig{Namespace: "md", Partitions: 1, LeaseTTL: time.Second, MaxKeyBacklog: 1},
		Handler:  counted,
	}, nil)
	if _, err := d.c.Submit(t.Context(), "k1", []byte("x"), keylane.WithID("s1")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "s1 running", func() bool { return runs.Load() == 1 })
	if _, err := d.c.Submit(t.Context(), "k1", []byte("x"), keylane.WithID("s1")); !errors.Is(err, keylane.ErrDuplicate) {
		t.Fatalf("second submit of s1 on a full key: %v, want ErrDuplicate", err)
	}
	close(gate)
	if _, err := d.c.Submit(t.Context(), "k2", []byte("x"), keylane.WithID("s2")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "both jobs settled", func() bool {
		n, _ := histogram(t, d.reg, "keylane_job_end_to_end_seconds", nil)
		return d.w.Stats().Succeeded == 2 && n >= 2
	})
	for outcome, want := range map[string]float64{OutcomeOK: 2, OutcomeDuplicate: 1} {
		if got := value(t, d.reg, "keylane_client_jobs_total", map[string]string{"op": OpSubmit, "outcome": outcome}); got != want {
			t.Errorf("keylane_client_jobs_total{op=%q,outcome=%q} = %v, want %v", OpSubmit, outcome, got, want)
		}
	}
	if n, _ := histogram(t, d.reg, "keylane_client_request_seconds", map[string]string{"op": OpSubmit}); n != 3 {
		t.Errorf("keylane_client_request_seconds{op=%q} has %d observations, want 3", OpSubmit, n)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (the duplicate was never stored)", n)
	}
	for _, name := range []string{"keylane_job_queue_wait_seconds", "keylane_job_run_seconds", "keylane_job_end_to_end_seconds"} {
		if n, _ := histogram(t, d.reg, name, nil); n != 2 {
			t.Errorf("%s has %d observations, want 2 (one per stored job)", name, n)
		}
	}
}

// TestBacklogAndInFlightPerPartition: jobs sent alone (batches of one, on
// a namespace with a key backlog cap where each goes on its key's
// subject) are held at most MaxInFlight at a time, the rest reported as
// the partition's backlog; the jobs of one batch message of several are
// read together (the window is checked before each message), so the
// worker holds them all, in flight, none in the backlog.
func TestBacklogAndInFlightPerPartition(t *testing.T) {
	const jobs = 10
	cases := []struct {
		name          string
		maxKeyBacklog int64
		send          func(t *testing.T, d *deployment)
		// backlog and inFlight while the handler blocks
		backlog, inFlight float64
	}{
		{
			name:          "batches of one",
			maxKeyBacklog: jobs,
			send: func(t *testing.T, d *deployment) {
				for i := range jobs {
					if _, err := d.c.Submit(t.Context(), fmt.Sprintf("k%d", i), nil); err != nil {
						t.Fatal(err)
					}
				}
			},
			// The worker holds MaxInFlight jobs and waits; the last one
			// delivered said 8 more were pending.
			backlog: jobs - 2, inFlight: 2,
		},
		{
			name: "batch message",
			send: func(t *testing.T, d *deployment) {
				c := d.c
				reqs := make([]keylane.Request, jobs)
				for i := range reqs {
					reqs[i] = keylane.Request{Key: fmt.Sprintf("k%d", i)}
				}
				out, err := c.SubmitMany(t.Context(), reqs)
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range out {
					if o.Err != nil {
						t.Fatal(o.Err)
					}
				}
			},
			// One message of 10 jobs, read while the window had room:
			// all are delivered and held.
			backlog: 0, inFlight: jobs,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gate := make(chan struct{})
			blocked := keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
				select {
				case <-gate:
					return nil, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
			d := start(t, keylane.WorkerConfig{
				ID:          "b1",
				Topology:    keylane.TopologyConfig{Namespace: "mb", Partitions: 1, LeaseTTL: time.Second, MaxKeyBacklog: tc.maxKeyBacklog},
				Handler:     blocked,
				Concurrency: 1,
				MaxInFlight: 2,
			}, func(d *deployment) { tc.send(t, d) })
			labels := map[string]string{"partition": "0", "worker": "b1"}
			gauges := func() [2]float64 {
				return [2]float64{value(t, d.reg, "keylane_partition_backlog", labels), value(t, d.reg, "keylane_partition_in_flight", labels)}
			}
			testwait.Until(t, 10*time.Second, fmt.Sprintf("[backlog in-flight] = [%v %v]", tc.backlog, tc.inFlight), func() ([2]float64, bool) {
				g := gauges()
				return g, g == [2]float64{tc.backlog, tc.inFlight}
			})
			close(gate)
			testwait.Until(t, 10*time.Second, "every job done, [backlog in-flight] = [0 0]", func() ([2]float64, bool) {
				g := gauges()
				return g, d.w.Stats().Succeeded == jobs && g == [2]float64{}
			})
		})
	}
}

// The observers' hooks run on the job path: they must not allocate.
func TestObserversDoNotAllocate(t *testing.T) {
	wo, co := NewWorker().Observer(), NewClient().Observer()
	fail := errors.New("x")
	allocs := testing.AllocsPerRun(1000, func() {
		wo.QueueWait(3, time.Millisecond)
		wo.Run(3, time.Millisecond)
		wo.Group(3, 17)
		wo.Settled(3, time.Millisecond)
		wo.LeaseRenewed(time.Millisecond, nil)
		wo.LeaseRenewed(time.Millisecond, fail)
		co.Submitted(time.Millisecond, nil)
		co.Called(time.Millisecond, keylane.ErrClosed)
		co.SubmittedMany(time.Millisecond, 10, 1)
	})
	if allocs != 0 {
		t.Fatalf("observers allocate %v times per round, want 0", allocs)
	}
}

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, OutcomeOK},
		{fmt.Errorf("%w (job x)", keylane.ErrDuplicate), OutcomeDuplicate},
		{&keylane.RemoteError{Message: "no"}, OutcomeRemoteError},
		{&keylane.NoReplyError{JobID: "x", Err: context.DeadlineExceeded}, OutcomeNoReply},
		{fmt.Errorf("keylane: submit x: %w", context.Canceled), OutcomeCanceled},
		{keylane.ErrBadJobID, OutcomeInvalid},
		{fmt.Errorf("wrapped: %w", keylane.ErrPayloadTooLarge), OutcomeInvalid},
		{fmt.Errorf("%w: %q", keylane.ErrReservedHeader, "Nats-Rollup"), OutcomeInvalid},
		{fmt.Errorf("%w (got %q)", partition.ErrKeySpace, "sku:7 "), OutcomeInvalid},
		{keylane.ErrNoTopology, OutcomeNoTopology},
		{keylane.ErrClosed, OutcomeClosed},
		{fmt.Errorf("keylane: submit x: %w", &keylane.KeyBacklogFullError{Key: "k", Cap: 5}), OutcomeBacklogFull},
		{errors.New("nats: connection closed"), OutcomeError},
	} {
		if got := Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// exportedFamilies gathers what a worker exports after runHandlerJobs,
// and again once the worker stopped with a job left waiting (the series
// that only a waiting job has, keylane_oldest_waiting_job_timestamp_seconds):
// the families of both, by name, each with the label names its series
// carry.
func exportedFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	d := runHandlerJobs(t)
	out := families(t, d.reg)
	sctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := d.w.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.c.Submit(t.Context(), "waits", []byte("x")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "a job waits", func() bool {
		return families(t, d.reg)["keylane_oldest_waiting_job_timestamp_seconds"] != nil
	})
	for name, mf := range families(t, d.reg) {
		if have := out[name]; have != nil {
			have.Metric = append(have.Metric, mf.Metric...)
		} else {
			out[name] = mf
		}
	}
	return out
}
