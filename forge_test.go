package keylane

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestDeadLetterOfAForgedIDTakesNoOthersPlace: two stored jobs carry the
// same Nats-Msg-Id (the server de-duplicates IDs per jobs stream, and a
// namespace with two shards has two; a raw publisher may aim a message
// with a victim's ID at the other shard), neither asks for its outcome to
// be kept, and both fail. Each must get its own dead letter: a dead
// letter's Nats-Msg-Id was the job's ID, so the dead-letter stream
// dropped the second as a duplicate, and its job was acked as
// dead-lettered with no dead letter stored, a lost job.
func TestDeadLetterOfAForgedIDTakesNoOthersPlace(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, StreamShards: 2})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	for p := range 2 {
		key := keyIn(p, 2, "k")
		if _, err := e.js.PublishMsg(ctx(t), rawJob(e, key, nats.Header{HeaderJobID: {"order-7"}, HeaderKey: {key}}, "bad")); err != nil {
			t.Fatalf("publish to partition %d: %v", p, err)
		}
	}
	dls := waitDead(t, e, 2)
	if len(dls) != 2 || dls[0].JobID != "order-7" || dls[1].JobID != "order-7" || dls[0].Key == dls[1].Key {
		t.Fatalf("dead letters %+v; want one of order-7 per key", dls)
	}
}

// TestForgedDelayedIDIsRefused: Keylane-Job-Id names a delayed job's ID
// on the copy the server makes when its schedule fires. From a raw
// publisher on a namespace without delays it would run the message under
// a victim's ID and keep its outcome there: the victim's own queued job
// was then answered with the forger's outcome and acked without running.
// Such a message is dead-lettered, and the victim's job runs.
func TestForgedDelayedIDIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	if _, err := e.js.PublishMsg(ctx(t), rawJob(e, "acct:1", nats.Header{
		HeaderDelayedID: {"victim-1"}, HeaderKey: {"acct:1"}, HeaderKeepOutcome: {"1"},
	}, "forged")); err != nil {
		t.Fatal(err)
	}
	cctx := ctx(t)
	res, err := e.client.Call(cctx, "acct:1", []byte("honest"), WithID("victim-1"))
	if err != nil || string(res) != "ok" || !h.saw("honest") {
		t.Fatalf("the victim's call: %q, %v (ran honest: %v); want it run", res, err, h.saw("honest"))
	}
	if h.saw("forged") {
		t.Fatal("the forged job ran")
	}
	dls := waitDead(t, e, 1)
	if !strings.Contains(dls[0].Error, HeaderDelayedID) || dls[0].JobID != "" {
		t.Fatalf("dead letter %+v; want the forged one, naming no ID", dls[0])
	}
}
