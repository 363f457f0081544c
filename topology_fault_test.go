package keylane

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

// TestInjectedReplySubjectIsDeadLettered: a job whose reply header names a
// subject outside the reply prefix (the server's API, the namespace's own
// subjects, anything) must not make the worker publish there with its
// permissions; it is dead-lettered as malformed.
func TestInjectedReplySubjectIsDeadLettered(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer })
	e.waitOwned(w)
	targets := []string{"$JS.API.STREAM.PURGE." + e.topo.Names.Dead(), e.ns + ".jobs.0", "elsewhere.subject", "_INBOX.>", "_INBOX"}
	sub, err := e.nc.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	for i, reply := range targets {
		m := nats.NewMsg(partition.Subject(e.ns, 0, "k"))
		m.Header.Set(HeaderKey, "k")
		m.Header.Set(HeaderJobID, "evil-"+strconv.Itoa(i))
		m.Header.Set(HeaderReply, reply)
		if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 10*time.Second, "the jobs settled", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	if d := e.deadLetters(); len(d) != len(targets) {
		t.Errorf("%d dead letters; want every injected job", len(d))
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "k"); got.Value != nil {
		t.Errorf("injected jobs applied: %q", got.Value)
	}
	for {
		m, err := sub.NextMsg(100 * time.Millisecond)
		if err != nil {
			break
		}
		for _, reply := range targets {
			if m.Subject == reply && m.Header.Get(HeaderKey) == "" {
				t.Errorf("the worker published to the injected subject %q", m.Subject)
			}
		}
	}
}

// TestNonPartitionSubjectsAreRefused: subjects that match the old jobs
// wildcard but are no partition must not be stored to rot.
func TestNonPartitionSubjectsAreRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 16})
	for _, subj := range []string{"jobs.23", "jobs.abc", "jobs.01", "jobs.-1", "jobs.0", "jobs.23.0123456789abcdef", "jobs.0.a.b", "delay.0.x"} {
		m := nats.NewMsg(e.topo.Names.Namespace + "." + subj)
		m.Header.Set(HeaderKey, "k")
		if _, err := e.js.PublishMsg(ctx(t), m); err == nil {
			t.Errorf("publish to %s stored", m.Subject)
		}
	}
	if n := e.streamMsgs(e.topo.Names.Jobs()); n != 0 {
		t.Fatalf("%d messages stored on non-partition subjects", n)
	}
}

// TestStaleClientPartitionCountIsRefused: a client that routed with another
// N (it outlived a repartition) gets a clear error, and nothing runs.
func TestStaleClientPartitionCountIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer })
	e.waitOwned(w)
	stale, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	stale.e.SetPartitionsHeader("8")
	_, err = stale.Call(ctx(t), "k", nil)
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered {
		t.Fatalf("stale client's call = %v; want a dead-lettered error", err)
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "k"); got.Value != nil {
		t.Fatalf("stale client's job applied: %q", got.Value)
	}
}

// TestRecreatedJobsStreamIsRefusedUntilAdopted: the jobs stream is deleted
// and created again (sequences restart at 1). Jobs of keys written before
// must not be treated as already applied; they wait, with a clear error,
// until the old epoch is adopted, and then apply on top of the old state.
func TestRecreatedJobsStreamIsRefusedUntilAdopted(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	red := func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer }
	w1 := e.worker("w1", nil, red)
	e.waitOwned(w1)
	for range 5 {
		if _, err := e.client.Call(ctx(t), "k", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := w1.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	old := e.topo.Meta.Epoch
	if err := e.js.DeleteStream(ctx(t), e.topo.Names.Jobs()); err != nil {
		t.Fatal(err)
	}
	topo, err := Setup(ctx(t), e.js, e.topo.Config)
	if err != nil {
		t.Fatal(err)
	}
	if topo.Meta.Epoch == old {
		t.Fatal("a new jobs stream kept the old epoch")
	}
	w2 := e.worker("w2", nil, red)
	e.waitOwned(w2)
	client, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	short, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	res, err := client.Call(short, "k", nil, WithID("after-recreate"))
	cancel()
	if !errors.Is(err, ErrNoReply) {
		t.Fatalf("call on a re-created stream = %q, %v; want it held (ErrNoReply), never a success", res, err)
	}
	if err := AdoptEpoch(ctx(t), e.js, e.ns, old); err != nil {
		t.Fatal(err)
	}
	res, err = client.Call(ctx(t), "k", nil, WithID("after-adopt"))
	if err != nil || string(res) != "7" {
		t.Fatalf("call after adopt = %q, %v; want 7 (5 before, the held one, this one)", res, err)
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), "k"); string(got.Value) != strconv.Itoa(7) {
		t.Fatalf("value %q, want 7", got.Value)
	}
}
