package keylane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// A killed worker (its connection gone: it renews nothing, releases
// nothing) leaves Inspect's members, and its partitions show its
// heartbeat lapsed, as soon as its entries missed a renew by a whole
// period (two thirds of the TTL, by the server's clock), while the
// server still holds them (it drops them a TTL after their last write).
// Before, it showed as member and live owner for that whole TTL.
func TestInspectDropsAWorkerWhoseHeartbeatLapsed(t *testing.T) {
	ttl := 6 * time.Second
	e := newEnv(t, TopologyConfig{Partitions: 2, LeaseTTL: ttl})
	nc := natstest.Connect(t, e.srv)
	w, err := NewWorker(nc, WorkerConfig{Topology: e.topo.Config, ID: "wk", Handler: HandlerFunc(func(_ context.Context, j Job) ([]byte, error) { return j.Payload, nil })})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the killed worker's goroutines end once Stop gives up on the closed connection
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
	e.waitOwned(w)
	st, err := Inspect(ctx(t), e.js, e.ns)
	if err != nil || !slices.Equal(st.Members, []string{"wk"}) || st.Partition[0].Owner != "wk" || st.Partition[0].Lapsed {
		t.Fatalf("a live worker: %+v, %v", st, err)
	}

	nc.Close() // killed
	members, err := e.js.KeyValue(ctx(t), e.topo.Names.Members())
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 3*ttl, "the killed worker out of the members, its partitions lapsed", func() bool {
		st, err = Inspect(ctx(t), e.js, e.ns)
		if err != nil || len(st.Members) != 0 {
			return false
		}
		for _, p := range st.Partition {
			if p.Owner != "wk" || !p.Lapsed {
				return false
			}
		}
		return true
	})
	if _, err := members.Get(ctx(t), "wk"); err != nil {
		t.Errorf("its member entry: %v; want it still on the server when Inspect drops it", err)
	}
}
