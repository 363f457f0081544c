package keylane

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestOneJobMessageIsRefused: every job travels in a batch message; a
// one-job message (an earlier client's, or a raw publisher's) that still
// reaches a jobs stream is dead-lettered unrun with a reason that says
// so, its Call answered at once with a permanent refusal (never a wait
// to its deadline), and the partition goes on: a job sent after it runs.
// A one-job delayed submission is refused the same way.
func TestOneJobMessageIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, Delays: true})
	var ran atomic.Int64
	w := e.worker("w", HandlerFunc(func(_ context.Context, job Job) ([]byte, error) {
		ran.Add(1)
		return []byte("ran " + job.Key), nil
	}), nil)
	e.waitOwned(w)
	old := newOneJobSender(t, e, natstest.Connect(t, e.srv))

	cctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	start := time.Now()
	res, err := old.call(cctx, "seat:1", []byte("old call"))
	cancel()
	var re *RemoteError
	if !errors.As(err, &re) || !re.Permanent || !strings.Contains(re.Message, "one-job message") {
		t.Fatalf("a one-job Call = %q, %v; want a permanent refusal naming the one-job message", res, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the one-job Call's refusal took %v", took)
	}
	if err := old.submit(ctx(t), "seat:2", []byte("old submit")); err != nil {
		t.Fatal(err)
	}
	// A one-job delayed submission, on its delay subject.
	m := old.msg("seat:3", []byte("old delayed"))
	m.Subject = partition.DelaySubject(e.ns, 0, m.Header.Get(HeaderJobID))
	m.Header[HeaderRunAt] = []string{time.Now().UTC().Format(time.RFC3339Nano)}
	if _, err := old.js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	if res, err := e.client.Call(ctx(t), "seat:4", nil); err != nil || string(res) != "ran seat:4" {
		t.Fatalf("a batch Call after the one-job messages = %q, %v", res, err)
	}
	testwait.Eventually(t, 10*time.Second, "three one-job messages dead-lettered", func() bool { return len(e.deadLetters()) == 3 })
	for _, d := range e.deadLetters() {
		why := d.Header.Get(HeaderError)
		if !strings.Contains(why, "one-job message") || !strings.Contains(why, "refused unrun") {
			t.Errorf("dead letter %d's reason %q does not name the one-job message", d.Sequence, why)
		}
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the handler ran %d jobs, want 1 (the batch Call's)", n)
	}
	testwait.Eventually(t, 10*time.Second, "the jobs stream empty (every message acked)", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
}

// TestOneJobStreamIsRefused: a jobs stream made by a keylane whose
// clients stored one-job messages (keylane.version 3) is refused by
// Setup, NewClient and a worker with ErrOldJobsStream and a message that
// says how to drain it; nothing of it changes.
func TestOneJobStreamIsRefused(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), js, TopologyConfig{Namespace: "older", Partitions: 2, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx(t), topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.Metadata[MetaVersion] = "3" // as the keylane before the one message format made it
	if _, err := js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(partition.Subject("older", partition.Of("seat:1", 2), "seat:1"))
	m.Header[HeaderKey] = []string{"seat:1"}
	m.Header[HeaderPartitions] = []string{"2"}
	m.Data = []byte("an earlier client's paid order")
	if _, err := js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrOldJobsStream) {
			t.Fatalf("%s on a keylane.version 3 stream: %v, want ErrOldJobsStream", what, err)
		}
		for _, want := range []string{`keylane.version "3"`, "one-job messages", "drain it with the keylane that made it", "nats stream rm " + topo.Names.Jobs(), "another namespace"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%s's refusal %q does not say %q", what, err, want)
			}
		}
	}
	_, err = Setup(ctx(t), js, TopologyConfig{Namespace: "older", LeaseTTL: time.Second})
	check("Setup", err)
	_, err = NewClient(ctx(t), nc, ClientConfig{Namespace: "older"})
	check("NewClient", err)
	w, err := NewWorker(natstest.Connect(t, srv), WorkerConfig{
		Topology: TopologyConfig{Namespace: "older", LeaseTTL: time.Second},
		Handler:  HandlerFunc(func(context.Context, Job) ([]byte, error) { return nil, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	check("a worker's Start", w.Start(ctx(t)))
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || info.Config.Metadata[MetaVersion] != "3" {
		t.Fatalf("the refused stream changed: %d messages, %s %q", info.State.Msgs, MetaVersion, info.Config.Metadata[MetaVersion])
	}
}
