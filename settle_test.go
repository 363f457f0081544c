package keylane

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestHandOverWaitsForItsAcks: a graceful hand-over must not give up on
// its acks after a fixed 2s (the successor would run the finished jobs
// again); it waits as long as they take, within its drain bound.
func TestHandOverWaitsForItsAcks(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	if _, err := e.client.Submit(ctx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
	cons, err := e.topo.Jobs.CreateOrUpdateConsumer(ctx(t), e.topo.consumerConfig(0, 30*time.Second, 16))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	if msg == nil {
		t.Fatal("no job fetched")
	}
	meta, _ := msg.Metadata()
	// The ack lands 3s later, as on a slow or busy server.
	ack := time.AfterFunc(3*time.Second, func() { _ = msg.Ack() })
	defer ack.Stop()
	start := time.Now()
	if !settleAcks(e.topo.Jobs, cons, meta.Sequence.Stream, nil, 10*time.Second) {
		t.Fatalf("settle gave up after %s before the ack landed", time.Since(start))
	}
	if d := time.Since(start); d < 3*time.Second {
		t.Fatalf("settle returned after %s, before the ack was sent", d)
	}
	// And it stops when told to (Stop's drain deadline), for an ack that
	// is never sent.
	if _, err := e.client.Submit(ctx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
	held, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range held.Messages() {
		meta, _ = m.Metadata()
	}
	stop := make(chan struct{})
	close(stop)
	if settleAcks(e.topo.Jobs, cons, meta.Sequence.Stream, stop, 10*time.Second) {
		t.Fatal("settle of an ack never sent reported success")
	}
}
