package keylane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/wire"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

func echo() HandlerFunc {
	return func(_ context.Context, j Job) ([]byte, error) { return append([]byte("done "), j.Payload...), nil }
}

func TestSetupIsIdempotentAndRefusesMismatch(t *testing.T) {
	e := newEnv(t, TopologyConfig{Namespace: "shop", Partitions: 6, LeaseTTL: time.Second})
	if _, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "shop", LeaseTTL: time.Second}); err != nil {
		t.Fatalf("second Setup with N taken from the stream: %v", err)
	}
	if _, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "shop", Partitions: 6, LeaseTTL: time.Second}); err != nil {
		t.Fatalf("second Setup with the same N: %v", err)
	}
	_, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "shop", Partitions: 8, LeaseTTL: time.Second})
	if !errors.Is(err, ErrPartitionMismatch) {
		t.Fatalf("Setup with another N: %v, want ErrPartitionMismatch", err)
	}
	if _, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: "shop", Partitions: 7}); !errors.Is(err, ErrPartitionMismatch) {
		t.Fatalf("client with another N: %v, want ErrPartitionMismatch", err)
	}
	if _, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: "nothing"}); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("client of a missing namespace: %v, want ErrNoTopology", err)
	}
	// The message names the namespace and says what creates it: a worker
	// or Setup (a client's Partitions creates nothing).
	if _, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: "nothing", Partitions: 4}); err == nil ||
		!strings.Contains(err.Error(), `namespace "nothing"`) || !strings.Contains(err.Error(), "start a worker") ||
		!strings.Contains(err.Error(), "Setup") || strings.Contains(err.Error(), "Partitions") {
		t.Fatalf("client of a missing namespace said %q; want it to name the namespace and say a worker or Setup creates it", err)
	}
	// A stream made with another hash is refused too.
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Metadata[MetaHash] = "fnv1a"
	if _, err := e.js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "shop", LeaseTTL: time.Second}); !errors.Is(err, ErrPartitionMismatch) {
		t.Fatalf("Setup against another hash: %v, want ErrPartitionMismatch", err)
	}
	for _, bad := range []TopologyConfig{{Namespace: "Bad NS"}, {Partitions: -1}, {Replicas: 9}, {DuplicateWindow: time.Second}} {
		if _, err := Setup(ctx(t), e.js, bad); err == nil {
			t.Errorf("Setup(%+v) accepted", bad)
		}
	}
}

func TestCallSubmitAndIdempotency(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	var runs atomic.Int64
	w := e.worker("w1", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		runs.Add(1)
		if j.Key == "" || j.Fence == 0 || j.Seq == 0 || j.Attempt != 1 {
			return nil, Permanent(fmt.Errorf("bad job %+v", j))
		}
		return []byte(j.Key + "=" + string(j.Payload)), nil
	}), nil)
	e.waitOwned(w)
	res, err := e.client.Call(ctx(t), "seat:A7", []byte("hold"))
	if err != nil || string(res) != "seat:A7=hold" {
		t.Fatalf("Call = %q, %v", res, err)
	}
	before := runs.Load()
	id1, err := e.client.Submit(ctx(t), "seat:B1", []byte("x"), WithID("order-1"))
	if err != nil || id1 != "order-1" {
		t.Fatalf("Submit = %q, %v", id1, err)
	}
	// The copy travels in a batch message, which the server does not
	// de-duplicate by the job's ID: it is stored, and the worker answers it
	// from the first's kept outcome without running it.
	id2, err := e.client.Submit(ctx(t), "seat:B1", []byte("x"), WithID("order-1"))
	if err != nil || id2 != "order-1" {
		t.Fatalf("duplicate Submit = %q, %v; want order-1 and nil (stored, never run twice)", id2, err)
	}
	// A Call after both proves they were processed (same key, in order).
	if _, err := e.client.Call(ctx(t), "seat:B1", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load() - before; got != 2 {
		t.Fatalf("handler ran %d times for a duplicated submit and one call, want 2", got)
	}
}

func TestBadInputIsRefusedAndStoresNothing(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	before := e.streamMsgs(e.topo.Names.Jobs())
	cases := []struct {
		name string
		key  string
		data []byte
		opts []SubmitOpt
		want error
	}{
		{"empty key", "", nil, nil, partition.ErrEmptyKey},
		{"long key", strings.Repeat("k", partition.MaxKeyLen+1), nil, nil, partition.ErrKeyTooLong},
		{"bad utf8", "\xff", nil, nil, partition.ErrKeyNotUTF8},
		{"big payload", "k", make([]byte, e.nc.MaxPayload()), nil, ErrPayloadTooLarge},
		{"bad id", "k", nil, []SubmitOpt{WithID("has space")}, ErrBadJobID},
		{"dot id", "k", nil, []SubmitOpt{WithID(".x")}, ErrBadJobID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.client.Submit(ctx(t), tc.key, tc.data, tc.opts...); !errors.Is(err, tc.want) {
				t.Fatalf("Submit: %v, want %v", err, tc.want)
			}
			if _, err := e.client.Call(ctx(t), tc.key, tc.data, tc.opts...); !errors.Is(err, tc.want) {
				t.Fatalf("Call: %v, want %v", err, tc.want)
			}
		})
	}
	out, err := e.client.SubmitMany(ctx(t), []Request{{Key: ""}, {Key: "ok", ID: "fine-1"}})
	if err != nil || !errors.Is(out[0].Err, partition.ErrEmptyKey) || out[1].Err != nil {
		t.Fatalf("SubmitMany = %+v, %v", out, err)
	}
	if got := e.streamMsgs(e.topo.Names.Jobs()); got != before+1 {
		t.Fatalf("stream holds %d jobs, want %d (only the valid one)", got, before+1)
	}
}

func TestRetriesInPlaceKeepKeyOrder(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	var mu sync.Mutex
	var seen []string
	w := e.worker("w1", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		mu.Lock()
		seen = append(seen, string(j.Payload)+"#"+strconv.Itoa(j.Attempt))
		mu.Unlock()
		if string(j.Payload) == "flaky" && j.Attempt < 3 {
			return nil, errors.New("try again")
		}
		return j.Payload, nil
	}), nil)
	e.waitOwned(w)
	if _, err := e.client.Submit(ctx(t), "k", []byte("flaky")); err != nil {
		t.Fatal(err)
	}
	res, err := e.client.Call(ctx(t), "k", []byte("next"))
	if err != nil || string(res) != "next" {
		t.Fatalf("Call = %q, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "flaky#1 flaky#2 flaky#3 next#1"
	if got := strings.Join(seen, " "); got != want {
		t.Fatalf("runs = %q, want %q", got, want)
	}
}

func TestFailuresAreDeadLetteredAndOtherKeysFlow(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	w := e.worker("w1", HandlerFunc(func(_ context.Context, j Job) ([]byte, error) {
		switch string(j.Payload) {
		case "poison":
			return nil, errors.New("always broken")
		case "fatal":
			return nil, Permanent(errors.New("cannot ever work"))
		case "panic":
			panic("handler bug")
		}
		return j.Payload, nil
	}), func(c *WorkerConfig) { c.MaxDeliver = 3 })
	e.waitOwned(w)
	for _, tc := range []struct{ payload, attempts string }{{"poison", "3"}, {"fatal", "1"}, {"panic", "3"}} {
		_, err := e.client.Call(ctx(t), "bad:"+tc.payload, []byte(tc.payload), WithID("job-"+tc.payload))
		var re *RemoteError
		if !errors.As(err, &re) || !re.DeadLettered || !errors.Is(err, ErrPermanent) {
			t.Fatalf("%s: Call error %v, want a dead-lettered RemoteError", tc.payload, err)
		}
		found := false
		for _, m := range e.deadLetters() {
			if wire.JobIDOfDead(m.Header) == "job-"+tc.payload {
				found = true
				if got := m.Header.Get(HeaderAttempts); got != tc.attempts {
					t.Errorf("%s: %s = %s, want %s", tc.payload, HeaderAttempts, got, tc.attempts)
				}
				if m.Header.Get(HeaderError) == "" || m.Header.Get(HeaderWorker) != "w1" || m.Header.Get(HeaderKey) != "bad:"+tc.payload {
					t.Errorf("%s: dead letter headers %v", tc.payload, m.Header)
				}
			}
		}
		if !found {
			t.Fatalf("%s: no dead letter", tc.payload)
		}
	}
	if res, err := e.client.Call(ctx(t), "good", []byte("fine")); err != nil || string(res) != "fine" {
		t.Fatalf("a good job after the poison ones: %q, %v", res, err)
	}
	if s := w.Stats(); s.DeadLettered != 3 {
		t.Fatalf("stats %+v, want 3 dead letters", s)
	}
}

func TestMuxUnknownType(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	mux := NewMux()
	mux.HandleType("echo", echo())
	w := e.worker("w1", mux, nil)
	e.waitOwned(w)
	if res, err := e.client.Call(ctx(t), "k", []byte("hi"), WithType("echo")); err != nil || string(res) != "done hi" {
		t.Fatalf("Call echo = %q, %v", res, err)
	}
	_, err := e.client.Call(ctx(t), "k", []byte("hi"), WithType("launch-missiles"))
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Message, "unknown job type") {
		t.Fatalf("unknown type: %v", err)
	}
}

func TestMalformedMessagesAreDeadLettered(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	w := e.worker("w1", echo(), nil)
	e.waitOwned(w)
	n := e.topo.Partitions
	raw := []*nats.Msg{
		{Subject: partition.Subject(e.ns, 1, ""), Data: []byte("no key header")},
		{Subject: partition.Subject(e.ns, 2, ""), Data: []byte{0xff, 0x00, 0x13}, Header: nats.Header{HeaderKey: []string{""}}},
		{Subject: partition.Subject(e.ns, 3, keyIn(0, n, "x")), Data: []byte("wrong partition"), Header: nats.Header{HeaderKey: []string{keyIn(0, n, "x")}}},
		// A key's job on another key's subject would bypass its backlog cap.
		{Subject: partition.Subject(e.ns, 1, keyIn(1, n, "y")), Data: []byte("wrong subject"), Header: nats.Header{HeaderKey: []string{keyIn(1, n, "z")}}},
	}
	for _, m := range raw {
		if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 10*time.Second, "four malformed messages dead-lettered", func() bool {
		return len(e.deadLetters()) == len(raw)
	})
	for _, m := range e.deadLetters() {
		if !strings.HasPrefix(m.Header.Get(HeaderError), "malformed") {
			t.Errorf("dead letter error %q", m.Header.Get(HeaderError))
		}
	}
	testwait.Eventually(t, 10*time.Second, "jobs stream empty", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	if res, err := e.client.Call(ctx(t), "fine", []byte("x")); err != nil || string(res) != "done x" {
		t.Fatalf("worker broken after malformed input: %q, %v", res, err)
	}
	if s := w.Stats(); s.Malformed != int64(len(raw)) {
		t.Fatalf("Malformed = %d, want %d", s.Malformed, len(raw))
	}
}

func TestLongJobIsKeptAliveWithInProgress(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	var runs atomic.Int64
	w := e.worker("w1", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		runs.Add(1)
		select {
		case <-time.After(2500 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, nil
	}), func(c *WorkerConfig) { c.AckWait = time.Second })
	e.waitOwned(w)
	// Two jobs of one key: the second waits 2.5 s in its lane, the first
	// runs 2.5 s; both exceed AckWait.
	if _, err := e.client.Submit(ctx(t), "slow", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Call(ctx(t), "slow", nil); err != nil {
		t.Fatal(err)
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2: a job was redelivered despite InProgress", got)
	}
}

func TestResultsBucketAnswersMissedResults(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	w := e.worker("w1", echo(), func(c *WorkerConfig) { c.StoreResults = true })
	e.waitOwned(w)
	id, err := e.client.Submit(ctx(t), "k", []byte("later"), WithID("res-1"))
	if err != nil {
		t.Fatal(err)
	}
	var res []byte
	testwait.Eventually(t, 10*time.Second, "result stored", func() bool {
		res, err = e.client.Result(ctx(t), id)
		return err == nil
	})
	if string(res) != "done later" {
		t.Fatalf("stored result %q", res)
	}
	if _, err := e.client.Result(ctx(t), "never-submitted"); !errors.Is(err, ErrNoResult) {
		t.Fatalf("Result of an unknown job: %v", err)
	}
}

// TestWorkerRefusesAnotherReplyPrefixOrMaxDeliver: like the partition
// count, the reply prefix (fixed when the namespace is created) and
// MaxDeliver (fixed by the first worker) are the namespace's: a worker
// configured with another is refused, naming both values; one that
// leaves them zero follows the namespace's.
func TestWorkerRefusesAnotherReplyPrefixOrMaxDeliver(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, ReplyPrefix: "_INBOX.x."})
	h := HandlerFunc(func(context.Context, Job) ([]byte, error) { return nil, nil })
	first := e.worker("w1", h, func(c *WorkerConfig) { c.MaxDeliver = 3 })
	if first.cfg.MaxDeliver != 3 {
		t.Fatalf("the first worker's MaxDeliver: %d", first.cfg.MaxDeliver)
	}
	for _, tc := range []struct {
		name   string
		mod    func(*WorkerConfig)
		want   error
		naming []string
	}{
		{"another reply prefix", func(c *WorkerConfig) { c.Topology.ReplyPrefix = "_INBOX.y." }, ErrReplyPrefixMismatch, []string{`"_INBOX.x."`, `"_INBOX.y."`}},
		{"another MaxDeliver", func(c *WorkerConfig) { c.MaxDeliver = 4 }, ErrMaxDeliverMismatch, []string{"after 3 attempts", "configured 4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := WorkerConfig{Topology: e.topo.Config, Handler: h, ID: "w2"}
			tc.mod(&cfg)
			w, err := NewWorker(natstest.Connect(t, e.srv), cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Start(ctx(t))
			if err == nil {
				_ = w.Stop(context.Background())
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start: %v; want %v", err, tc.want)
			}
			for _, s := range tc.naming {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%v does not name %s", err, s)
				}
			}
		})
	}
	follower := e.worker("w3", h, func(c *WorkerConfig) { c.Topology.ReplyPrefix, c.MaxDeliver = "", 0 })
	if follower.cfg.MaxDeliver != 3 || follower.topo.Meta.ReplyPrefix != "_INBOX.x." {
		t.Fatalf("a worker following the namespace: MaxDeliver %d, reply prefix %q; want 3 and _INBOX.x.", follower.cfg.MaxDeliver, follower.topo.Meta.ReplyPrefix)
	}
}
