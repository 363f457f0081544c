package keylane

import (
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// waitConsumers waits until ws own every partition and each partition's
// consumer exists: a stream update racing a consumer's
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

// TestRunningWorkerSaysWhenTheMetadataIsRefused: a keylane.max-deliver
// that is no number written under a running worker. It keeps its
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
	sc.Metadata[MetaMaxDeliver] = "yes"
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
