package keylane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestDeadLettersRedriveAndPurge: a job that failed permanently is listed
// with its error, redriven once its cause is fixed — the new outcome is
// kept under the original ID, so Result of the original job sees it —
// and the dead letter is gone; Purge empties the rest.
func TestDeadLettersRedriveAndPurge(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
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
