package keylane

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// runLog records which jobs a handler ran, and when.
type runLog struct {
	mu   sync.Mutex
	runs []run
}

type run struct {
	id, payload string
	at          time.Time
}

func (l *runLog) handler() HandlerFunc {
	return func(_ context.Context, j Job) ([]byte, error) {
		l.mu.Lock()
		l.runs = append(l.runs, run{j.ID, string(j.Payload), time.Now()})
		l.mu.Unlock()
		return []byte("ok"), nil
	}
}

func (l *runLog) of(id string) []run {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []run
	for _, r := range l.runs {
		if r.id == id {
			out = append(out, r)
		}
	}
	return out
}

func (l *runLog) order() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.runs {
		out = append(out, r.id)
	}
	return out
}

// TestDelayedJobRunsAtItsTimeInKeyOrder: a delayed job (a seat's hold
// that expires) does not run before its time, runs after it exactly once,
// and joins its key's queue when due: a job of the key submitted after it
// but due earlier runs first.
func TestDelayedJobRunsAtItsTimeInKeyOrder(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var log runLog
	e.worker("w1", log.handler(), nil)
	due := time.Now().Add(2 * time.Second)
	if _, err := e.client.Submit(ctx(t), "seat:A7", []byte("release"), WithID("release.1"), WithRunAt(due)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Submit(ctx(t), "seat:A7", []byte("hold"), WithID("hold-2")); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the immediate job ran", func() bool { return len(log.of("hold-2")) == 1 })
	if got := log.of("release.1"); len(got) != 0 && got[0].at.Before(due) {
		t.Fatalf("the delayed job ran at %s, before its time %s", got[0].at, due)
	}
	testwait.Eventually(t, 10*time.Second, "the delayed job ran", func() bool { return len(log.of("release.1")) == 1 })
	r := log.of("release.1")[0]
	if r.at.Before(due) || r.payload != "release" {
		t.Fatalf("delayed job ran at %s (due %s) with %q", r.at, due, r.payload)
	}
	t.Logf("the delayed job ran %s after its time", r.at.Sub(due))
	// Exactly once: the stream holds nothing more (no schedule, no copy),
	// and a later job of the key runs after it.
	testwait.Eventually(t, 10*time.Second, "jobs stream empty", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	// The delays stream too: the schedule went when it fired, its due
	// copy once the worker received it.
	testwait.Eventually(t, 10*time.Second, "delays stream empty", func() bool { return e.streamMsgs(e.topo.Names.Delays()) == 0 })
	if res, err := e.client.Call(ctx(t), "seat:A7", []byte("after")); err != nil || string(res) != "ok" {
		t.Fatalf("call after: %q, %v", res, err)
	}
	if n := len(log.of("release.1")); n != 1 {
		t.Fatalf("the delayed job ran %d times", n)
	}
	if o := log.order(); len(o) != 3 || o[0] != "hold-2" || o[1] != "release.1" {
		t.Fatalf("run order %v, want hold-2, release.1, then the call", o)
	}
	if res, err := e.client.Result(ctx(t), "release.1"); err != nil || string(res) != "ok" {
		t.Fatalf("Result of the delayed job: %q, %v", res, err)
	}
}

// TestDelayedJobSurvivesServerRestart: the schedule is stored, so a
// server restarted (same store) before the job's time still runs it, once
// and not early.
func TestDelayedJobSurvivesServerRestart(t *testing.T) {
	srv := startRestartable(t, "delay-restart")
	wnc, cnc := srv.connect(), srv.connect()
	var log runLog
	w, err := NewWorker(wnc, WorkerConfig{Topology: TopologyConfig{Partitions: 1, LeaseTTL: time.Second, Delays: true}, Handler: log.handler(), ID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := NewClient(ctx(t), cnc, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	due := time.Now().Add(3 * time.Second)
	if _, err := c.Submit(ctx(t), "seat:B2", []byte("release"), WithID("d1"), WithRunAt(due)); err != nil {
		t.Fatal(err)
	}
	srv.restart()
	testwait.Eventually(t, 20*time.Second, "the delayed job ran after the restart", func() bool { return len(log.of("d1")) > 0 })
	if r := log.of("d1")[0]; r.at.Before(due) {
		t.Fatalf("ran at %s, before its time %s", r.at, due)
	}
	testwait.Eventually(t, 10*time.Second, "client reconnected", cnc.IsConnected)
	if res, err := c.Call(ctx(t), "seat:B2", []byte("after")); err != nil || string(res) != "ok" {
		t.Fatalf("call after: %q, %v", res, err)
	}
	if n := len(log.of("d1")); n != 1 {
		t.Fatalf("the delayed job ran %d times", n)
	}
}

// TestDelayBadInputStoresNothing: bad delays, a delayed Call, and a delay
// on a namespace made without Delays are refused, and nothing is stored;
// Delays cannot be combined with a backlog cap nor turned on later.
func TestDelayBadInputStoresNothing(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	for _, tc := range []struct {
		name string
		opt  SubmitOpt
	}{
		{"negative delay", WithDelay(-time.Second)},
		{"beyond the maximum", WithDelay(MaxDelay + time.Hour)},
		{"run-at in the past", WithRunAt(time.Now().Add(-time.Minute))},
		{"run-at beyond the maximum", WithRunAt(time.Now().Add(MaxDelay + time.Hour))},
	} {
		if _, err := e.client.Submit(ctx(t), "k", nil, tc.opt); !errors.Is(err, ErrBadDelay) {
			t.Errorf("%s: %v, want ErrBadDelay", tc.name, err)
		}
	}
	if out, _ := e.client.SubmitMany(ctx(t), []Request{{Key: "k", RunAt: time.Now().Add(-time.Hour)}}); !errors.Is(out[0].Err, ErrBadDelay) {
		t.Errorf("SubmitMany with a past run-at: %v, want ErrBadDelay", out[0].Err)
	}
	if _, err := e.client.Call(ctx(t), "k", nil, WithDelay(time.Second)); !errors.Is(err, ErrDelayedCall) {
		t.Errorf("delayed Call: %v, want ErrDelayedCall", err)
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 0 {
		t.Fatalf("%d messages stored by refused submits", n)
	}
	if err := Repartition(ctx(t), e.js, e.ns, 3, nil); err != nil {
		t.Fatalf("repartition with no delayed job waiting: %v", err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(ctx(t), "k", nil, WithDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := Repartition(ctx(t), e.js, e.ns, 4, nil); err == nil {
		t.Fatal("repartition with a delayed job waiting accepted")
	}
	if _, err := c.Submit(ctx(t), "k", nil); err != nil {
		t.Fatalf("submit after the refused repartition (it must unfreeze): %v", err)
	}

	plain := newEnv(t, TopologyConfig{Partitions: 2})
	if _, err := plain.client.Submit(ctx(t), "k", nil, WithDelay(time.Minute)); !errors.Is(err, ErrDelaysOff) {
		t.Errorf("delay on a namespace without Delays: %v, want ErrDelaysOff", err)
	}
	if n := plain.streamMsgs(plain.topo.Names.Jobs()); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
	cfg := plain.topo.Config
	cfg.Delays = true
	if _, err := Setup(ctx(t), plain.js, cfg); !errors.Is(err, ErrDelaysOff) {
		t.Errorf("Setup with Delays on a namespace made without: %v, want ErrDelaysOff", err)
	}
	if _, err := Setup(ctx(t), plain.js, TopologyConfig{Namespace: "both", Delays: true, MaxKeyBacklog: 10}); err == nil {
		t.Error("Setup with Delays and MaxKeyBacklog accepted")
	}
}

// TestDelayedJobsOnShards: every jobs stream shard takes its partitions'
// delayed jobs, and each runs on its key's partition.
func TestDelayedJobsOnShards(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4, StreamShards: 2, Delays: true})
	var log runLog
	w := e.worker("w1", log.handler(), nil)
	e.waitOwned(w)
	for p := range 4 {
		key := keyIn(p, 4, "seat:")
		if _, err := e.client.Submit(ctx(t), key, nil, WithID("d-"+key[5:]), WithDelay(500*time.Millisecond)); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
	}
	testwait.Eventually(t, 10*time.Second, "every delayed job ran", func() bool { return len(log.order()) == 4 })
	testwait.Eventually(t, 10*time.Second, "both shards empty", func() bool {
		return e.streamMsgs(e.topo.Names.JobsShard(0))+e.streamMsgs(e.topo.Names.JobsShard(1)) == 0
	})
	if o := log.order(); len(o) != 4 {
		t.Fatalf("runs %v, want each of the 4 delayed jobs once", o)
	}
}

// TestDelayedJobSurvivesWorkerRestart: the worker that was running when
// the job was submitted (and moved it into the delays stream) is gone when
// it comes due; the next one runs it, once. A job submitted while no
// worker runs waits as a submission; the next owner moves it and runs it
// when due.
func TestDelayedJobSurvivesWorkerRestart(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, Delays: true})
	var log runLog
	w1 := e.worker("w1", log.handler(), nil)
	e.waitOwned(w1)
	due := time.Now().Add(time.Second)
	if _, err := e.client.Submit(ctx(t), "seat:C3", []byte("release"), WithID("c3"), WithRunAt(due)); err != nil {
		t.Fatal(err)
	}
	// w1 moves the submission into the delays stream before it stops.
	testwait.Eventually(t, 20*time.Second, "the submission moved", func() bool {
		info, err := e.topo.Jobs.Info(ctx(t), jetstream.WithSubjectFilter(e.ns+".delay.>"))
		return err == nil && info.State.Msgs == 0 && len(info.State.Subjects) == 0 && e.streamMsgs(e.topo.Names.Delays()) > 0
	})
	if err := w1.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the job is due and stored for its key", func() bool {
		info, err := e.topo.Jobs.Info(ctx(t), jetstream.WithSubjectFilter(e.ns+".>"))
		return err == nil && len(info.State.Subjects) == 1 && info.State.Subjects[partition.Subject(e.ns, 0, "seat:C3")] == 1
	})
	// Submitted with no worker running: it waits as a submission, which
	// the next owner moves.
	due4 := time.Now().Add(500 * time.Millisecond)
	if _, err := e.client.Submit(ctx(t), "seat:C3", []byte("release"), WithID("c4"), WithRunAt(due4)); err != nil {
		t.Fatal(err)
	}
	if n := len(log.order()); n != 0 {
		t.Fatalf("%d jobs ran with no worker", n)
	}
	e.worker("w2", log.handler(), nil)
	testwait.Eventually(t, 20*time.Second, "the next worker ran both", func() bool { return len(log.of("c3")) == 1 && len(log.of("c4")) == 1 })
	if res, err := e.client.Call(ctx(t), "seat:C3", []byte("after")); err != nil || string(res) != "ok" {
		t.Fatalf("call after: %q, %v", res, err)
	}
	if o := log.order(); len(o) != 3 || o[0] != "c3" || o[1] != "c4" || log.of("c3")[0].at.Before(due) || log.of("c4")[0].at.Before(due4) {
		t.Fatalf("runs %v: want c3 then c4 once each, not before their time, then the call", o)
	}
}

// TestDelayedSubmissionIsABatchOfOne: a delayed job's submission travels
// in the one format, a batch of one on its ID's delay subject with
// Keylane-Run-At on the message, under a batch ID of its own; submitted
// twice by its caller's ID, it is stored twice and runs once, when due.
// (Before the one path: a one-job message under the job's ID.)
func TestDelayedSubmissionIsABatchOfOne(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	due := time.Now().Add(2 * time.Second)
	for range 2 {
		if id, err := e.client.Submit(ctx(t), "seat:A7", []byte("release"), WithID("release.1"), WithRunAt(due)); err != nil || id != "release.1" {
			t.Fatalf("submit = %q, %v", id, err)
		}
	}
	p := partition.Of("seat:A7", 2)
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := s.GetMsg(ctx(t), seq)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != partition.DelaySubject(e.ns, p, "release.1") || m.Header.Get(wire.HeaderBatch) != "1" || m.Header.Get(wire.HeaderBatchJobs) != "1" ||
			m.Header.Get(HeaderRunAt) != due.UTC().Format(time.RFC3339Nano) || m.Header.Get(HeaderJobID) == "release.1" {
			t.Fatalf("stored submission %d on %s with headers %v: want a batch of one on the delay subject, its run-at on the message, its own batch ID", seq, m.Subject, m.Header)
		}
	}
	var log runLog
	e.worker("w1", log.handler(), nil)
	testwait.Eventually(t, 15*time.Second, "the delayed job ran", func() bool { return len(log.of("release.1")) >= 1 })
	if r := log.of("release.1")[0]; r.at.Before(due) || r.payload != "release" {
		t.Fatalf("delayed job ran at %s (due %s) with %q", r.at, due, r.payload)
	}
	testwait.Eventually(t, 10*time.Second, "jobs stream empty", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	testwait.Eventually(t, 10*time.Second, "delays stream empty", func() bool { return e.streamMsgs(e.topo.Names.Delays()) == 0 })
	if _, err := e.client.Call(ctx(t), "seat:A7", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if n := len(log.of("release.1")); n != 1 {
		t.Fatalf("the delayed job ran %d times, want once", n)
	}
}
