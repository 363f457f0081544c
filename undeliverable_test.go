package keylane

import (
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"

	"github.com/nats-io/nats.go"
)

// TestStatusLookalikeDoesNotStallThePartition: a raw job with an empty
// payload and a Status header is taken by nats.go's pull iterator for a
// status message from the server and never handed to the worker, which
// then sees a gap in the consumer's deliveries, re-synchronises, meets the
// same message again and stalls its partition for good ("delivery 2
// after 0" re-syncs). The worker must find such a message behind the gap,
// dead-letter it with the reason and remove it, and the partition's later
// jobs run.
func TestStatusLookalikeDoesNotStallThePartition(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	w := e.worker("w", h.handler(), nil)
	e.waitOwned(w)
	callWithin(t, e.client, 20*time.Second, "warm:0")
	for _, status := range []string{"100", "404", "408", "409"} {
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "order:1", nats.Header{
			HeaderJobID: {"lookalike-" + status}, HeaderKey: {"order:1"}, "Status": {status}, "Description": {"forged"},
		}, "")); err != nil {
			t.Fatal(err)
		}
	}
	// A later job of the partition is delivered behind them: the gap.
	callWithin(t, e.client, 30*time.Second, "other:1")
	callWithin(t, e.client, 30*time.Second, "order:1")
	dls := waitDead(t, e, 4)
	for _, d := range dls {
		if !strings.Contains(d.Error, "Status header") || !strings.HasPrefix(d.JobID, "lookalike-") {
			t.Errorf("dead letter %d: job %q, error %q; want the lookalike's ID and the reason", d.Seq, d.JobID, d.Error)
		}
	}
	// A job is acked after its reply: wait for the last one's ack, and for
	// the lookalikes' deletes.
	testwait.Eventually(t, 20*time.Second, "the jobs stream empty", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
}

// TestSwallowedHeartbeatLookalikeNeedsNoResync: a lookalike of a
// heartbeat (Status 100) is swallowed without an error, and the next
// delivery shows a gap of exactly that message. The owner dead-letters
// and removes it and goes on without re-synchronising: a raw publisher
// cannot make every partition drop and re-fetch its queue with one
// message each.
func TestSwallowedHeartbeatLookalikeNeedsNoResync(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	w := e.worker("w", h.handler(), nil)
	e.waitOwned(w)
	callWithin(t, e.client, 20*time.Second, "warm:0")
	before := w.Stats().Resyncs
	for i := range 3 {
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "order:1", nats.Header{
			HeaderJobID: {"heartbeat-" + string(rune('a'+i))}, HeaderKey: {"order:1"}, "Status": {"100"},
		}, "")); err != nil {
			t.Fatal(err)
		}
		callWithin(t, e.client, 30*time.Second, "other:1")
	}
	waitDead(t, e, 3)
	if after := w.Stats().Resyncs; after != before {
		t.Errorf("%d re-synchronisations for 3 heartbeat lookalikes; want none", after-before)
	}
}
