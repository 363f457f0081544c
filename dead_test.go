package keylane

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

// TestDeadLettersRedriveAndPurge: a job that failed permanently is listed
// with its error, redriven once its cause is fixed — the new outcome is
// kept under the original ID, so Result of the original job sees it —
// and the dead letter is gone; Purge empties the rest.
func TestDeadLettersRedriveAndPurge(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var broken atomic.Bool
	broken.Store(true)
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		if broken.Load() {
			return nil, Permanent(errors.New("inventory service down"))
		}
		return []byte("booked " + string(job.Payload)), nil
	}), nil)
	if _, err := e.client.Call(ctx(t), "seat:9", []byte("ann"), WithID("order-1"), WithType("book")); err == nil {
		t.Fatal("the job succeeded while broken")
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 1
	})
	d := dls[0]
	if d.JobID != "order-1" || d.Key != "seat:9" || d.Type != "book" || string(d.Payload) != "ann" || d.Error != "inventory service down" || d.Worker != "w" {
		t.Fatalf("dead letter %+v", d)
	}
	if _, err := e.client.Result(ctx(t), "order-1"); !errors.Is(err, ErrPermanent) {
		t.Fatalf("Result of the dead-lettered job: %v, want its permanent error", err)
	}
	broken.Store(false)
	id, err := e.client.Redrive(ctx(t), d)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the original ID answers with the redriven outcome", func() bool {
		res, err := e.client.Result(ctx(t), "order-1")
		return err == nil && string(res) == "booked ann"
	})
	if res, err := e.client.Result(ctx(t), id); err != nil || string(res) != "booked ann" {
		t.Fatalf("Result of the redriven job %s: %q, %v", id, res, err)
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the redrive: %+v, %v", dls, err)
	}
	broken.Store(true)
	for _, id := range []string{"order-2", "order-3"} {
		_, _ = e.client.Call(ctx(t), "seat:9", []byte("bob"), WithID(id))
	}
	n, err := PurgeDeadLetters(ctx(t), e.js, e.ns)
	if err != nil || n != 2 {
		t.Fatalf("purge: %d, %v; want 2", n, err)
	}
	if _, err := DeadLetterAt(ctx(t), e.js, e.ns, d.Seq); err == nil {
		t.Fatal("a redriven dead letter is still readable")
	}
	if _, err := e.client.Redrive(ctx(t), DeadLetter{Seq: 99, JobID: "x", Key: "k", PayloadDropped: 5}); !errors.Is(err, ErrPayloadDropped) {
		t.Fatalf("redrive of a dropped payload: %v", err)
	}
}

// TestRedriveWithoutJobID: a dead letter whose job came without an ID (a
// producer that sent no Nats-Msg-Id) is redriven under an ID derived from
// its sequence and partition; one of a delayed job (whose Nats-Msg-Id the
// server strips; its ID travels in Keylane-Job-Id) carries that ID, and
// its redrive answers under it.
func TestRedriveWithoutJobID(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2, Delays: true})
	var broken atomic.Bool
	broken.Store(true)
	var ran atomic.Int64
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		if broken.Load() {
			return nil, Permanent(errors.New("down"))
		}
		ran.Add(1)
		return []byte("done " + string(job.Payload)), nil
	}), nil)
	m := nats.NewMsg(partition.Subject(e.ns, partition.Of("k", 2), "k"))
	m.Header.Set(HeaderKey, "k")
	m.Data = []byte("p")
	if _, err := e.js.PublishMsg(ctx(t), m); err != nil {
		t.Fatal(err)
	}
	// A delayed job: its ID comes back in Keylane-Job-Id, from the schedule.
	if _, err := e.client.Submit(ctx(t), "k", []byte("pdelayed-7"), WithID("delayed-7"), WithDelay(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var dls []DeadLetter
	testwait.Eventually(t, 10*time.Second, "two dead letters", func() bool {
		var err error
		dls, err = DeadLetters(ctx(t), e.js, e.ns, 0, 10)
		return err == nil && len(dls) == 2
	})
	broken.Store(false)
	var ids []string
	for _, d := range dls {
		id, err := e.client.Redrive(ctx(t), d)
		if err != nil {
			t.Fatalf("redrive of dead letter %d (job %q): %v", d.Seq, d.JobID, err)
		}
		again, err := e.client.Redrive(ctx(t), d)
		if err != nil || again != id {
			t.Fatalf("the same dead letter redriven again: %q, %v; want %q (one job)", again, err, id)
		}
		ids = append(ids, id)
	}
	if dls[0].JobID != "" || dls[1].JobID != "delayed-7" {
		t.Fatalf("dead letters' job IDs %q and %q, want none and delayed-7", dls[0].JobID, dls[1].JobID)
	}
	if !strings.HasPrefix(ids[0], "redrive-p"+strconv.Itoa(dls[0].Partition)+"-"+strconv.FormatUint(dls[0].Seq, 10)+"-") {
		t.Fatalf("the ID-less dead letter was redriven as %q", ids[0])
	}
	testwait.Eventually(t, 10*time.Second, "both redriven jobs ran", func() bool {
		a, err1 := e.client.Result(ctx(t), ids[0])
		b, err2 := e.client.Result(ctx(t), "delayed-7")
		return err1 == nil && err2 == nil && string(a) == "done p" && string(b) == "done pdelayed-7"
	})
	if n := ran.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
	if dls, err := DeadLetters(ctx(t), e.js, e.ns, 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the redrives: %+v, %v", dls, err)
	}
}
