package keylane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// wantFull fails the test unless err is the typed backlog refusal of key.
func wantFull(t *testing.T, what string, err error, key string, limit int64) {
	t.Helper()
	var full *KeyBacklogFullError
	if !errors.Is(err, ErrKeyBacklogFull) || !errors.As(err, &full) || full.Key != key || full.Cap != limit {
		t.Fatalf("%s: %v, want a KeyBacklogFullError for %q with cap %d", what, err, key, limit)
	}
}

// TestKeyBacklogCapRefusesBeyondN: with MaxKeyBacklog N, the (N+1)th
// stored-but-unfinished job of a key is refused by Submit, Call (also
// through atomic batches) and SubmitMany with the typed error, at once
// and storing nothing, while another key of the same partition gets in; a
// retry by ID of a stored job is a duplicate, not "full"; once the worker
// has run the key's jobs it is admitted again.
func TestKeyBacklogCapRefusesBeyondN(t *testing.T) {
	const limit = 3
	e := newEnv(t, TopologyConfig{Partitions: 2, MaxKeyBacklog: limit})
	if e.topo.Config.MaxKeyBacklog != limit {
		t.Fatalf("topology MaxKeyBacklog = %d, want %d", e.topo.Config.MaxKeyBacklog, limit)
	}
	hot, other := keyIn(0, 2, "hot"), keyIn(0, 2, "other")
	for i := range limit {
		if _, err := e.client.Submit(ctx(t), hot, []byte("buy"), WithID("hot-"+strconv.Itoa(i))); err != nil {
			t.Fatalf("job %d of %d: %v", i+1, limit, err)
		}
	}
	stored := func() uint64 { return e.streamMsgs(e.topo.Names.Jobs()) }
	if n := stored(); n != limit {
		t.Fatalf("stream holds %d jobs, want %d", n, limit)
	}

	start := time.Now()
	_, err := e.client.Submit(ctx(t), hot, []byte("buy"))
	wantFull(t, "Submit over the cap", err, hot, limit)
	_, err = e.client.Submit(ctx(t), hot, []byte("buy"), WithID("hot-new"))
	wantFull(t, "Submit WithID over the cap", err, hot, limit)
	_, err = e.client.Call(ctx(t), hot, []byte("buy"))
	wantFull(t, "Call over the cap", err, hot, limit)
	_, err = e.client.Call(ctx(t), hot, []byte("buy"), WithID("hot-call"))
	wantFull(t, "Call WithID over the cap", err, hot, limit)
	many, err := e.client.SubmitMany(ctx(t), []Request{{Key: hot, Payload: []byte("buy")}, {Key: hot, Payload: []byte("buy")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range many {
		wantFull(t, "SubmitMany over the cap", s.Err, hot, limit)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = e.client.Call(ctx(t), hot, []byte("buy")) })
	}
	wg.Wait()
	for _, err := range errs {
		wantFull(t, "concurrent Call over the cap", err, hot, limit)
	}
	// Refused at once: nothing was retried until a deadline.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the refusals took %s", d)
	}
	if n := stored(); n != limit {
		t.Fatalf("stream holds %d jobs after the refusals, want %d: something was stored", n, limit)
	}

	// A retry of a stored job is answered as what it is, not as "full".
	if _, err := e.client.Submit(ctx(t), hot, []byte("buy"), WithID("hot-0")); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("Submit retry of a stored job: %v, want ErrDuplicate", err)
	}
	retried := make(chan error, 1)
	go func() {
		res, err := e.client.Call(ctx(t), hot, []byte("buy"), WithID("hot-1"))
		if err == nil && string(res) != "done buy" {
			err = fmt.Errorf("result %q", res)
		}
		retried <- err
	}()

	// Another key of the same partition still gets in, up to its own cap.
	for i := range limit {
		if _, err := e.client.Submit(ctx(t), other, []byte("buy")); err != nil {
			t.Fatalf("other key, job %d: %v", i+1, err)
		}
	}
	_, err = e.client.Submit(ctx(t), other, []byte("buy"))
	wantFull(t, "other key over its cap", err, other, limit)

	w := e.worker("w1", echo(), nil)
	if err := <-retried; err != nil {
		t.Fatalf("Call retry of a stored job: %v, want its outcome", err)
	}
	testwait.Eventually(t, 10*time.Second, "the worker drained both keys", func() bool { return stored() == 0 })
	for i := range limit {
		if res, err := e.client.Call(ctx(t), hot, []byte("again")); err != nil || string(res) != "done again" {
			t.Fatalf("after the drain, call %d: %q, %v", i+1, res, err)
		}
	}
	if s := w.Stats(); s.Malformed != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestKeyBacklogCountsRunningJobs: a job that runs (fetched, not acked) is
// part of its key's backlog until it finishes.
func TestKeyBacklogCountsRunningJobs(t *testing.T) {
	const limit = 2
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: limit})
	release := make(chan struct{})
	started := make(chan string, 8)
	e.worker("w1", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		started <- j.ID
		<-release
		return nil, nil
	}), nil)
	for i := range limit {
		if _, err := e.client.Submit(ctx(t), "seat:A7", nil, WithID("s"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if id := <-started; id != "s0" {
		t.Fatalf("first job run %s", id)
	}
	_, err := e.client.Submit(ctx(t), "seat:A7", nil)
	wantFull(t, "Submit while one job runs and one waits", err, "seat:A7", limit)
	close(release)
	testwait.NoError(t, 10*time.Second, "admitted once the key's jobs finished", func() error {
		_, err := e.client.Submit(ctx(t), "seat:A7", nil)
		return err
	})
}

// TestKeyBacklogCapIsFixed: the cap is fixed when the namespace is made; a
// worker or Setup that names another one is refused and changes nothing
// (the server would delete stored jobs over a new cap); 0 follows it; every
// shard carries it.
func TestKeyBacklogCapIsFixed(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4, StreamShards: 2, MaxKeyBacklog: 5})
	for i := range 2 {
		s, err := e.js.Stream(ctx(t), e.topo.Names.JobsShard(i))
		if err != nil {
			t.Fatal(err)
		}
		if sc := s.CachedInfo().Config; sc.MaxMsgsPerSubject != 5 || !sc.DiscardNewPerSubject || sc.Discard != jetstream.DiscardNew {
			t.Fatalf("shard %d: MaxMsgsPerSubject %d, DiscardNewPerSubject %v, Discard %v", i, sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject, sc.Discard)
		}
	}
	for _, c := range []int64{3, 6} {
		cfg := e.topo.Config
		cfg.MaxKeyBacklog = c
		if _, err := Setup(ctx(t), e.js, cfg); !errors.Is(err, ErrKeyBacklogMismatch) {
			t.Fatalf("Setup with cap %d on a namespace of 5: %v, want ErrKeyBacklogMismatch", c, err)
		}
	}
	cfg := e.topo.Config
	cfg.MaxKeyBacklog = 0
	topo, err := Setup(ctx(t), e.js, cfg)
	if err != nil || topo.Config.MaxKeyBacklog != 5 || topo.Meta.MaxKeyBacklog != 5 {
		t.Fatalf("Setup with cap 0: %v; want it to follow the namespace's 5", err)
	}
	st, err := Inspect(ctx(t), e.js, e.ns)
	if err != nil || st.MaxKeyBacklog != 5 {
		t.Fatalf("Inspect: %v, MaxKeyBacklog %d", err, st.MaxKeyBacklog)
	}
	cfg.MaxKeyBacklog = -1
	if _, err := Setup(ctx(t), e.js, cfg); err == nil {
		t.Fatal("Setup with cap -1 accepted")
	}

	// A namespace made without a cap does not get one later.
	plain, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "plain", Partitions: 2, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg = plain.Config
	cfg.MaxKeyBacklog = 10
	if _, err := Setup(ctx(t), e.js, cfg); !errors.Is(err, ErrKeyBacklogMismatch) {
		t.Fatalf("Setup with a cap on an uncapped namespace: %v, want ErrKeyBacklogMismatch", err)
	}
	s, err := e.js.Stream(ctx(t), plain.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.CachedInfo().Config; sc.MaxMsgsPerSubject > 0 || sc.DiscardNewPerSubject {
		t.Fatalf("the refused Setup changed the stream: MaxMsgsPerSubject %d", sc.MaxMsgsPerSubject)
	}
}

// TestOldSubjectSchemeIsRefused: a jobs stream made before per-key subjects
// (one literal subject per partition) holds jobs today's consumers would
// never read: Setup and NewClient refuse it by name and change nothing.
func TestOldSubjectSchemeIsRefused(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	old := jetstream.StreamConfig{
		Name: "OLD_JOBS", Subjects: []string{"old.jobs.0", "old.jobs.1"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, Discard: jetstream.DiscardNew,
		Metadata: map[string]string{MetaPartitions: "2", MetaHash: partition.HashName, MetaVersion: "2", MetaEpoch: "abc", MetaReplyPrefix: "_INBOX."},
	}
	if _, err := js.CreateStream(ctx(t), old); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx(t), "old.jobs.1", []byte("a paid order")); err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(ctx(t), js, TopologyConfig{Namespace: "old", LeaseTTL: time.Second}); !errors.Is(err, ErrOldJobsStream) {
		t.Fatalf("Setup on an old stream: %v, want ErrOldJobsStream", err)
	}
	if _, err := NewClient(ctx(t), nc, ClientConfig{Namespace: "old"}); !errors.Is(err, ErrOldJobsStream) {
		t.Fatalf("NewClient on an old stream: %v, want ErrOldJobsStream", err)
	}
	s, err := js.Stream(ctx(t), "OLD_JOBS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.Config.Subjects, old.Subjects) || info.State.Msgs != 1 {
		t.Fatalf("the old stream was changed: subjects %v, %d jobs", info.Config.Subjects, info.State.Msgs)
	}
}

// TestKeySubjects: on a namespace with a key backlog cap, every job
// travels alone, a batch of one on its key's own subject inside its
// partition's, which is what the server counts per key. Without a cap a job travels in a batch
// message on its partition's batch subject, no key's, its key in the body
// (no Keylane-Key header).
func TestKeySubjects(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4, MaxKeyBacklog: 10})
	keys := []string{"sku:1", "siège A7", "a.b>*", "sku:1"}
	for _, k := range keys {
		if _, err := e.client.Submit(ctx(t), k, nil); err != nil {
			t.Fatal(err)
		}
	}
	msgs := natstest.StreamMsgs(t, e.js, e.topo.Names.Jobs())
	if len(msgs) != len(keys) {
		t.Fatalf("%d jobs stored", len(msgs))
	}
	for i, m := range msgs {
		want := partition.Subject(e.ns, partition.Of(keys[i], 4), keys[i])
		jobs, err := wire.DecodeBatch(m.Data)
		if m.Subject != want || m.Header.Get(wire.HeaderBatchJobs) != "1" || err != nil || len(jobs) != 1 || jobs[0].Key != keys[i] {
			t.Errorf("job %d of %q on %s (%v, %v), want a batch of one on %s", i, keys[i], m.Subject, m.Header, err, want)
		}
	}

	// Uncapped: batches, one per Submit here (each waits for its ack).
	topo, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "uncapped", Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: topo.Names.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, k := range keys {
		if _, err := c.Submit(ctx(t), k, nil); err != nil {
			t.Fatal(err)
		}
	}
	msgs = natstest.StreamMsgs(t, e.js, topo.Names.Jobs())
	if len(msgs) != len(keys) {
		t.Fatalf("%d messages stored, want a batch of one per Submit", len(msgs))
	}
	for i, m := range msgs {
		want := wire.BatchSubject(topo.Names.Namespace, partition.Of(keys[i], 4))
		jobs, err := wire.DecodeBatch(m.Data)
		if m.Subject != want || m.Header.Get(HeaderKey) != "" || err != nil || len(jobs) != 1 || jobs[0].Key != keys[i] {
			t.Errorf("job %d of %q on %s (Keylane-Key %q), body %+v, %v; want a batch of it alone on %s", i, keys[i], m.Subject, m.Header.Get(HeaderKey), jobs, err, want)
		}
	}
	// A foreign publish to a partition's bare old subject is refused by
	// the server: nothing is stored where no consumer reads.
	if _, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: e.ns + ".jobs.1", Header: nats.Header{HeaderKey: {"x"}}}); err == nil {
		t.Fatal("publish to the bare partition subject stored")
	}
}

// TestKeyBacklogRetryOfAnAppliedJobGetsItsOutcome: a retry by ID that the
// duplicate window no longer catches (here a server restart rebuilt the
// table without the acked job) and that meets a full key is answered with
// the applied job's outcome, never "full": a shop must not say "sold out"
// to a purchase that went through.
func TestKeyBacklogRetryOfAnAppliedJobGetsItsOutcome(t *testing.T) {
	srv := startRestartable(t, "full-restart")
	nc, wnc := srv.connect(), srv.connect()
	w, err := NewWorker(wnc, WorkerConfig{Topology: TopologyConfig{Partitions: 1, LeaseTTL: time.Second, MaxKeyBacklog: 1}, Handler: echo(), ID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), nc, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, err := c.Call(ctx(t), "ticket:1", []byte("order-1"), WithID("order-1")); err != nil || string(res) != "done order-1" {
		t.Fatalf("first call: %q, %v", res, err)
	}
	if err := w.Stop(ctx(t)); err != nil {
		t.Fatal(err)
	}
	srv.restart()
	testwait.Eventually(t, 10*time.Second, "client reconnected", nc.IsConnected)
	testwait.NoError(t, 10*time.Second, "the filler job stored", func() error {
		_, err := c.Submit(ctx(t), "ticket:1", []byte("filler"))
		return err
	})
	if res, err := c.Call(ctx(t), "ticket:1", []byte("order-1"), WithID("order-1")); err != nil || string(res) != "done order-1" {
		t.Fatalf("retried call of the applied job on a full key: %q, %v; want its outcome", res, err)
	}
	if _, err := c.Submit(ctx(t), "ticket:1", []byte("order-1"), WithID("order-1")); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("retried submit of the applied job on a full key: %v, want ErrDuplicate", err)
	}
	_, err = c.Submit(ctx(t), "ticket:1", []byte("order-2"), WithID("order-2"))
	wantFull(t, "a new job on the full key", err, "ticket:1", 1)
}

// TestRedriveIntoAFullKeyKeepsTheDeadLetter: a redrive the key's cap
// refuses says so, and the dead letter stays to be redriven later.
func TestRedriveIntoAFullKeyKeepsTheDeadLetter(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: 1})
	release := make(chan struct{})
	e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		switch string(j.Payload) {
		case "bad":
			return nil, Permanent(errors.New("refused"))
		case "block":
			<-release
		}
		return []byte("ok"), nil
	}), nil)
	if _, err := e.client.Call(ctx(t), "seat:1", []byte("bad"), WithID("bad-1")); err == nil {
		t.Fatal("the bad job succeeded")
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	// The bad job's message leaves the key's queue at its ack, which may
	// come after its dead letter is read: until then the cap refuses the
	// next job (storing nothing), so the test waits for room.
	testwait.NoError(t, 10*time.Second, "the blocking job stored", func() error {
		_, err := e.client.Submit(ctx(t), "seat:1", []byte("block"))
		return err
	})
	_, err := e.client.Redrive(ctx(t), dls[0])
	wantFull(t, "Redrive into a full key", err, "seat:1", 1)
	if again, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(again) != 1 {
		t.Fatalf("dead letters after the refused redrive: %d, %v; want it kept", len(again), err)
	}
	close(release)
	testwait.NoError(t, 10*time.Second, "redriven once the key has room", func() error {
		_, err := e.client.Redrive(ctx(t), dls[0])
		return err
	})
}
