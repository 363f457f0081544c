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

// TestTrailingStatusLookalikeIsRemoved: a lookalike that is the last job
// of its partition is swallowed by nats.go with no later delivery to show
// the gap, and again at every redelivery (each AckWait): no gap is ever
// seen, so it was never dead-lettered nor removed, and stayed in the
// work-queue stream for as long as its partition had no other traffic (a
// backlog that never drained, the worker silent; e2e TestHostileWire's
// "1 jobs left"). The owner of an idle partition must notice that the
// server delivered what never reached it, and dead-letter and remove
// each such message, with no later job to help.
func TestTrailingStatusLookalikeIsRemoved(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	w := e.worker("w", h.handler(), func(c *WorkerConfig) { c.AckWait = 2 * time.Second })
	e.waitOwned(w)
	callWithin(t, e.client, 20*time.Second, "warm:0")
	publish := func(id, status string) {
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "order:1", nats.Header{
			HeaderJobID: {id}, HeaderKey: {"order:1"}, "Status": {status}, "Description": {"forged"},
		}, "")); err != nil {
			t.Fatal(err)
		}
	}
	// Four in a row, nothing after them; then, once they are gone, one
	// more alone.
	for _, status := range []string{"100", "404", "408", "409"} {
		publish("trailing-"+status, status)
	}
	testwait.Eventually(t, 40*time.Second, "the trailing lookalikes dead-lettered and removed", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	publish("trailing-again", "100")
	testwait.Eventually(t, 40*time.Second, "a second trailing lookalike dead-lettered and removed", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
	for _, d := range waitDead(t, e, 5) {
		if !strings.Contains(d.Error, "Status header") || !strings.HasPrefix(d.JobID, "trailing-") {
			t.Errorf("dead letter %d: job %q, error %q; want the lookalike's ID and the reason", d.Seq, d.JobID, d.Error)
		}
	}
	callWithin(t, e.client, 20*time.Second, "order:1")
}
