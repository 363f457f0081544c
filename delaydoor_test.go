package keylane

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDelaysNamespaceKeepsItsDoorShut: on a namespace with delayed jobs a
// raw publisher with only the client's rights can neither delete queued
// jobs (Nats-Rollup: sub on a key's subject), nor delete a waiting delayed
// job (a schedule purge naming its schedule), nor run a message under a
// victim's job ID by dressing it as a delayed job's due copy
// (Keylane-Job-Id with a Nats-Scheduler naming the victim's schedule).
// Each is refused by the server at publish; every honest job runs once.
//
// It failed before delayed jobs moved out of the jobs stream: that stream
// had to allow roll-ups and schedules, so the roll-up was stored and
// purged the key's three queued jobs, the purge deleted the waiting
// delayed job, and the dressed message was stored and run as "victim-1".
func TestDelaysNamespaceKeepsItsDoorShut(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, Delays: true})
	for _, id := range []string{"q1", "q2", "q3"} {
		if _, err := e.client.Submit(ctx(t), "sku:7", []byte(id), WithID(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.client.Submit(ctx(t), "seat:1", []byte("release"), WithID("hold-1"), WithDelay(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	refusedOrDead := 0
	publish := func(what string, m *nats.Msg) {
		t.Helper()
		_, err := e.js.PublishMsg(ctx(t), m)
		var api *jetstream.APIError
		switch {
		case errors.As(err, &api):
			t.Logf("%s refused at publish: %v", what, err)
		case err != nil:
			t.Fatalf("%s: %v", what, err)
		default:
			t.Logf("%s stored", what)
			refusedOrDead++
		}
	}
	publish("roll-up", rawJob(e, "sku:7", nats.Header{HeaderKey: {"sku:7"}, "Nats-Rollup": {"sub"}}, "rollup"))
	for _, sched := range []string{partition.DelaySubject(e.ns, 0, "hold-1"), partition.ScheduleSubject(e.ns, 0, "hold-1")} {
		purge := rawJob(e, "sku:7", nats.Header{HeaderKey: {"sku:7"}, "Nats-Scheduler": {sched}, "Nats-Schedule-Next": {"purge"}}, "purge")
		publish("schedule purge of "+sched, purge)
		for _, src := range []string{"", e.topo.Names.Delays() + " 1 x y z abc"} {
			h := nats.Header{HeaderKey: {"sku:7"}, HeaderDelayedID: {"victim-1"}, HeaderKeepOutcome: {"1"},
				"Nats-Scheduler": {strings.Replace(sched, "hold-1", "victim-1", 1)}, "Nats-Schedule-Next": {"purge"}}
			if src != "" {
				h["Nats-Stream-Source"] = []string{src}
			}
			publish("a forged due copy", rawJob(e, "sku:7", h, "forged"))
		}
	}

	// Past the server (no Nats-* header): dead-lettered by the worker.
	publish("a due copy's ID without its marks", rawJob(e, "sku:7", nats.Header{HeaderKey: {"sku:7"}, HeaderDelayedID: {"victim-1"}, HeaderKeepOutcome: {"1"}}, "forged"))
	publish("a run-at on a key's subject", rawJob(e, "sku:7", nats.Header{HeaderKey: {"sku:7"}, HeaderRunAt: {time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)}}, "runat"))

	var h failOn
	e.waitOwned(e.worker("w", h.handler(), nil))
	res, err := e.client.Call(ctx(t), "sku:7", []byte("honest"), WithID("victim-1"))
	if err != nil || string(res) != "ok" || !h.saw("honest") {
		t.Fatalf("the victim's call: %q, %v (ran honest: %v); want it run", res, err, h.saw("honest"))
	}
	for _, id := range []string{"q1", "q2", "q3"} {
		if !h.saw(id) {
			t.Errorf("queued job %s never ran: a raw publisher deleted it", id)
		}
	}
	testwait.Eventually(t, 20*time.Second, "the delayed job ran", func() bool { return h.saw("release") })
	for _, p := range []string{"forged", "rollup", "purge", "runat"} {
		if h.saw(p) {
			t.Errorf("the raw %q message ran", p)
		}
	}
	if refusedOrDead > 0 {
		waitDead(t, e, refusedOrDead)
	}
}

// TestRepartitionWaitsForDelayedJobs: a repartition refuses to change N
// while a delayed job waits in the delays stream (it would come due on
// its old partition's subject), changing nothing; once the job ran it
// goes through, and a delayed job submitted afterwards comes due in its
// new partition (the new jobs streams source the new partitions' due
// subjects).
func TestRepartitionWaitsForDelayedJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var log runLog
	w := e.worker("w", log.handler(), nil)
	e.waitOwned(w)
	if _, err := e.client.Submit(ctx(t), "seat:1", []byte("release"), WithID("hold-1"), WithDelay(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Moved into the delays stream, it waits there.
	testwait.Eventually(t, 10*time.Second, "the schedule stored", func() bool { return e.streamMsgs(e.topo.Names.Delays()) == 1 })
	err := Repartition(ctx(t), e.js, e.ns, 4, nil)
	if err == nil || !strings.Contains(err.Error(), "delayed jobs wait") {
		t.Fatalf("repartition with a delayed job waiting: %v; want a refusal", err)
	}
	if st, err := Inspect(ctx(t), e.js, e.ns); err != nil || st.Partitions != 2 {
		t.Fatalf("after the refusal: %+v, %v; want N still 2", st, err)
	}
	testwait.Eventually(t, 20*time.Second, "the delayed job ran", func() bool { return len(log.of("hold-1")) == 1 })
	testwait.Eventually(t, 20*time.Second, "repartitioned", func() bool {
		return Repartition(ctx(t), e.js, e.ns, 4, nil) == nil
	})
	testwait.Eventually(t, 30*time.Second, "the worker reloaded", func() bool { return w.Topology().Partitions == 4 && len(w.Owned()) == 4 })
	fresh, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	for p := range 4 {
		key := keyIn(p, 4, "seat:")
		if _, err := fresh.Submit(ctx(t), key, nil, WithID("d-"+key[5:]), WithDelay(300*time.Millisecond)); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
	}
	testwait.Eventually(t, 20*time.Second, "every new delayed job ran", func() bool { return len(log.order()) == 5 })
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %+v, %v; want none", dls, err)
	}
}
