package keylane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
)

// TestKeyBacklogRetryOfAQueuedJobIsNotFull: a key at its cap (1) holds a
// stored order that no worker ran yet; past the stream's duplicate window
// (shortened here to 100ms) the server refuses a retry of that order by
// ID as over the cap, not as a duplicate. The client must not answer
// "backlog full, nothing stored" for an order that is stored and will be
// applied (on main: KeyBacklogFullError from both Submit and Call): Submit
// says ErrDuplicate, a Call waits for the order's outcome and gets it
// once a worker runs it, once. A new order on the full key is still
// refused as full.
func TestKeyBacklogRetryOfAQueuedJobIsNotFull(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1, MaxKeyBacklog: 1})
	c := e.client
	// (Shortened before the order is stored: nats-server 2.15 applies a
	// window changed later only to IDs stored after the change, at times.)
	info, err := e.topo.Jobs.Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	sc := info.Config
	sc.Duplicates = 100 * time.Millisecond
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx(t), "ticket:1", []byte("order-1"), WithID("order-1")); err != nil {
		t.Fatal(err)
	}
	stored := natstest.StreamMsgs(t, e.js, e.topo.Names.Jobs())
	if len(stored) != 1 {
		t.Fatalf("%d jobs stored, want 1", len(stored))
	}
	testwait.Eventually(t, 10*time.Second, "the server forgot the order's ID (a copy is refused over the cap)", func() bool {
		m := nats.NewMsg(stored[0].Subject)
		m.Header.Set(nats.MsgIdHdr, "order-1")
		_, err := e.js.PublishMsg(ctx(t), m)
		return backlogFull(err)
	})

	if _, err := c.Submit(ctx(t), "ticket:1", []byte("order-1"), WithID("order-1")); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("retried submit of the queued order: %v; want ErrDuplicate (stored, nothing new)", err)
	}
	_, err = c.Submit(ctx(t), "ticket:1", []byte("order-2"), WithID("order-2"))
	wantFull(t, "a new order on the full key", err, "ticket:1", 1)

	type answer struct {
		res []byte
		err error
	}
	called := make(chan answer, 1)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The call goes out before any worker runs: nothing may answer it but
	// the order's own outcome.
	go func() {
		res, err := c.Call(cctx, "ticket:1", []byte("order-1"), WithID("order-1"))
		called <- answer{res, err}
	}()
	var runs atomic.Int32
	e.worker("w", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		runs.Add(1)
		return echo()(ctx, j)
	}), nil)
	a := <-called
	if a.err != nil || string(a.res) != "done order-1" {
		t.Fatalf("retried call of the queued order: %q, %v; want its outcome", a.res, a.err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the order ran %d times, want once", n)
	}
}
