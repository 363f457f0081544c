package keylane

import (
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestBatchesFollowTheNamespace: the namespace's metadata keylane.batches
// (SetBatches) decides who sends and reads batch messages. While it is
// off, NewClient refuses ClientConfig.Batches (its workers may
// dead-letter batches) and a client with the field unset sends one-job
// messages; once it is on, a worker without WorkerConfig.Batches is
// refused at Start (it would dead-letter every batch), a client with the
// field unset sends batches and NoBatches keeps one-job messages.
func TestBatchesFollowTheNamespace(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, StreamShards: 2})
	client := func(cfg ClientConfig) (*Client, error) {
		t.Helper()
		cfg.Namespace = e.ns
		c, err := NewClient(ctx(t), e.nc, cfg)
		if err == nil {
			t.Cleanup(c.Close)
		}
		return c, err
	}
	if _, err := client(ClientConfig{Batches: true}); !errors.Is(err, ErrBatchesMismatch) {
		t.Fatalf("Batches on a namespace without keylane.batches: %v, want ErrBatchesMismatch", err)
	}
	if c, err := client(ClientConfig{}); err != nil || c.wire != nil {
		t.Fatalf("a default client of a namespace without keylane.batches: %v, batches %t; want one-job messages", err, c != nil && c.wire != nil)
	}
	if _, err := client(ClientConfig{Batches: true, NoBatches: true}); err == nil {
		t.Fatal("Batches and NoBatches both accepted")
	}
	// A worker without Batches starts while the namespace says nothing.
	e.waitConsumers(e.worker("plain", echo(), nil))

	if err := SetBatches(ctx(t), e.js, e.ns, true); err != nil {
		t.Fatal(err)
	}
	for name, sc := range e.shardConfigs() {
		if sc.Metadata[MetaBatches] != "on" {
			t.Fatalf("shard %s has %s %q after SetBatches on", name, MetaBatches, sc.Metadata[MetaBatches])
		}
	}
	w, err := NewWorker(e.nc, WorkerConfig{Topology: e.topo.Config, Handler: echo(), ID: "late"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); !errors.Is(err, ErrBatchesMismatch) || !strings.Contains(err.Error(), "dead-letter every batch") {
		t.Fatalf("a worker without Batches on a namespace that says on: %v, want ErrBatchesMismatch", err)
	}
	// (plain started before: it steps down when batches turn on;
	// TestRunningWorkerWithoutBatchesStepsDown.)
	for _, cfg := range []ClientConfig{{}, {Batches: true}} {
		if c, err := client(cfg); err != nil || c.wire == nil {
			t.Fatalf("client %+v of a namespace that says on: %v; want it to send batches", cfg, err)
		}
	}
	if c, err := client(ClientConfig{NoBatches: true}); err != nil || c.wire != nil {
		t.Fatalf("a NoBatches client: %v; want one-job messages", err)
	}
	if err := SetBatches(ctx(t), e.js, e.ns, false); err != nil {
		t.Fatal(err)
	}
	if _, err := client(ClientConfig{Batches: true}); !errors.Is(err, ErrBatchesMismatch) {
		t.Fatalf("Batches after SetBatches off: %v, want ErrBatchesMismatch", err)
	}
}

// TestBatchesMetadataRefusedWhenBad: a value of keylane.batches other
// than on or off is refused by clients and workers, not read as off;
// shards that disagree (a SetBatches running, or stopped half way) read
// as shard 0, which SetBatches writes last; SetBatches mends the shards.
func TestBatchesMetadataRefusedWhenBad(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, StreamShards: 2})
	setMeta := func(stream, v string) {
		t.Helper()
		s, err := e.js.Stream(ctx(t), stream)
		if err != nil {
			t.Fatal(err)
		}
		sc := s.CachedInfo().Config
		sc.Metadata = maps.Clone(sc.Metadata)
		sc.Metadata[MetaBatches] = v
		if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
			t.Fatal(err)
		}
	}
	setMeta(e.topo.Names.Jobs(), "yes")
	if _, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns}); !errors.Is(err, ErrBatchesMismatch) || !strings.Contains(err.Error(), `"yes"`) {
		t.Fatalf("keylane.batches yes: %v, want ErrBatchesMismatch naming it", err)
	}
	if _, err := Setup(ctx(t), e.js, e.topo.Config); !errors.Is(err, ErrBatchesMismatch) {
		t.Fatalf("Setup on keylane.batches yes: %v, want ErrBatchesMismatch", err)
	}
	if err := SetBatches(ctx(t), e.js, e.ns, false); err != nil {
		t.Fatalf("SetBatches over a bad value: %v", err)
	}
	if c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns}); err != nil || c.wire != nil {
		t.Fatalf("after SetBatches off mended the value: %v", err)
	} else {
		c.Close()
	}
	// Shard 0 on, shard 1 off: what SetBatches off leaves while it runs
	// (shard 0 is written last). Shard 0's is the namespace's: a client
	// opening it then sends batches, it is not refused for a passing
	// state (it was, with ErrBatchesMismatch, and Setup too).
	setMeta(e.topo.Names.Jobs(), "on")
	if c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns}); err != nil || c.wire == nil {
		t.Fatalf("shards that disagree, shard 0 on: %v, want a client that batches", err)
	} else {
		c.Close()
	}
	if _, err := Setup(ctx(t), e.js, e.topo.Config); err != nil {
		t.Fatalf("Setup on shards that disagree: %v", err)
	}
	if err := SetBatches(ctx(t), e.js, e.ns, true); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil || c.wire == nil {
		t.Fatalf("after SetBatches mended the shards: %v", err)
	}
	c.Close()
	if err := SetBatches(ctx(t), e.js, "nowhere", true); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("SetBatches on a namespace that does not exist: %v, want ErrNoTopology", err)
	}
}

// TestRunningWorkerWithoutBatchesStepsDown: batches turned on while a
// worker without WorkerConfig.Batches runs (the operator's promise
// broken). The worker must not go on dead-lettering every batch the
// clients now send, acknowledged jobs all of them: it says so at ERROR,
// releases its partitions and stops, Err and Run saying
// ErrBatchesMismatch; a worker with Batches takes the partitions and runs
// the batches, none dead-lettered.
func TestRunningWorkerWithoutBatchesStepsDown(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	var buf syncBuffer
	plain := e.worker("plain", echo(), func(c *WorkerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	})
	e.waitConsumers(plain)
	if err := SetBatches(ctx(t), e.js, e.ns, true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-plain.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker without Batches still runs 30s after batches were turned on (owns %v); it logged: %s", plain.Owned(), buf.String())
	}
	if err := plain.Err(); !errors.Is(err, ErrBatchesMismatch) {
		t.Fatalf("Err of the worker that stepped down: %v, want ErrBatchesMismatch", err)
	}
	if !strings.Contains(buf.String(), "stepping down") {
		t.Fatalf("the worker did not say why it stopped at ERROR: %q", buf.String())
	}
	batched := e.worker("batches", echo(), func(c *WorkerConfig) { c.Batches = true })
	e.waitOwned(batched)
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil || c.wire == nil {
		t.Fatalf("a client of the namespace: %v (want it to batch)", err)
	}
	defer c.Close()
	var reqs []Request
	for i := range 20 {
		reqs = append(reqs, Request{Key: "seat:" + strconv.Itoa(i%5), Payload: []byte("buy")})
	}
	out, err := c.SubmitMany(ctx(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	testwait.Eventually(t, 30*time.Second, "every batched job run", func() bool {
		return batched.Stats().Succeeded >= 20
	})
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// waitConsumers waits until ws own every partition and each partition's
// consumer exists: a stream update (SetBatches) racing a consumer's
// creation trips a data race inside nats-server 2.15.2 under -race
// (fileStore.UpdateConfig against ConsumerStore).
func (e *env) waitConsumers(ws ...*Worker) {
	e.t.Helper()
	e.waitOwned(ws...)
	testwait.Eventually(e.t, 10*time.Second, "every partition's consumer", func() bool {
		for p := range e.topo.Partitions {
			if _, err := e.topo.StreamOf(p).Consumer(ctx(e.t), e.topo.Names.Consumer(p)); err != nil {
				return false
			}
		}
		return true
	})
}

// TestRunningWorkerSaysWhenTheMetadataIsRefused: a keylane.batches value
// other than on or off written under a running worker. It keeps its
// topology (nothing to act on) and says so at WARN, once: the watcher
// swallowed the refusal before, so a bad value was silent.
func TestRunningWorkerSaysWhenTheMetadataIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var buf syncBuffer
	w := e.worker("w", echo(), func(c *WorkerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	e.waitConsumers(w)
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.Metadata = maps.Clone(sc.Metadata)
	sc.Metadata[MetaBatches] = "yes"
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the worker's WARN on the refused metadata", func() bool {
		return strings.Contains(buf.String(), "metadata unread") && strings.Contains(buf.String(), `\"yes\"`)
	})
	if got := w.Owned(); len(got) != 1 {
		t.Fatalf("the worker owns %v after a refused metadata read, want it to keep partition 0", got)
	}
}

// TestBatchCorkMustNotBeNegative: a negative BatchCork is refused by
// NewClient with an error naming it, whatever the namespace says of
// batches (it would otherwise be ignored until batches were turned on).
func TestBatchCorkMustNotBeNegative(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	_, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns, BatchCork: -time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "BatchCork") {
		t.Fatalf("NewClient with a negative BatchCork: %v, want an error naming BatchCork", err)
	}
}
