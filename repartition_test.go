package keylane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// TestRepartitionKeepsEveryKeysState changes N from 4 to 8 while workers
// run and a backlog waits: the backlog drains first, every key's state
// carries over, the workers reload and own all 8 partitions, and a client
// that outlived the change is refused, never left to rot.
func TestRepartitionKeepsEveryKeysState(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	red := func(c *WorkerConfig) { c.Handler, c.Reducer = nil, countReducer }
	w1, w2 := e.worker("w1", nil, red), e.worker("w2", nil, red)
	e.waitOwned(w1, w2)
	const keys = 20
	key := func(i int) string { return fmt.Sprintf("sku:%d", i) }
	for i := range keys {
		if _, err := e.client.Call(ctx(t), key(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	backlog := make([]Request, 0, 10*keys)
	for range 10 {
		for i := range keys {
			backlog = append(backlog, Request{Key: key(i)})
		}
	}
	if _, err := e.client.SubmitMany(ctx(t), backlog); err != nil {
		t.Fatal(err)
	}
	var seen []uint64
	if err := Repartition(ctx(t), e.js, e.ns, 8, func(left uint64) { seen = append(seen, left) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("drain progress: %v", seen)
	testwait.Eventually(t, 30*time.Second, "workers reloaded and own all 8 partitions", func() bool {
		var owned []int
		for _, w := range []*Worker{w1, w2} {
			if w.Topology().Partitions != 8 {
				return false
			}
			owned = append(owned, w.Owned()...)
		}
		slices.Sort(owned)
		return slices.Equal(owned, []int{0, 1, 2, 3, 4, 5, 6, 7})
	})
	fresh, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if fresh.Partitions() != 8 {
		t.Fatalf("a new client sees %d partitions", fresh.Partitions())
	}
	for i := range keys {
		res, err := fresh.Call(ctx(t), key(i), nil)
		if err != nil || string(res) != strconv.Itoa(12) {
			t.Fatalf("%s after repartition = %q, %v; want 12 (1 + 10 drained + this one)", key(i), res, err)
		}
	}
	// The client opened before the change routes with N=4: every job is
	// refused with an error, none applies.
	for i := range keys {
		_, err := e.client.Call(ctx(t), key(i), nil)
		var re *RemoteError
		if !errors.As(err, &re) || !re.DeadLettered {
			t.Fatalf("stale client's call on %s = %v; want a dead-lettered refusal", key(i), err)
		}
		if i == 0 {
			t.Logf("stale client: %v", err)
		}
	}
	if got, _ := NewState(e.topo.State).Get(ctx(t), key(0)); string(got.Value) != "12" {
		t.Fatalf("a stale client's job applied: %q", got.Value)
	}
	// The refused jobs are acked after their callers were told.
	testwait.Eventually(t, 10*time.Second, "no job left to rot in the new stream", func() bool {
		return e.streamMsgs(e.topo.Names.Jobs()) == 0
	})
}

// TestSetupLeavesAFrozenStreamFrozen: a worker that starts while a
// repartition drains the frozen jobs stream must not give it its subjects
// back (jobs stored then would be deleted with the stream); its Setup
// waits, and fails only when its context ends.
func TestSetupLeavesAFrozenStreamFrozen(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	sc := e.topo.Jobs.CachedInfo().Config
	sc.Subjects = []string{e.ns + ".frozen.1"}
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx(t), 500*time.Millisecond)
	defer cancel()
	if _, err := Setup(sctx, e.js, e.topo.Config); err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("Setup on a frozen stream: %v, want it to wait and say the stream is frozen", err)
	}
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; len(got) != 1 || got[0] != e.ns+".frozen.1" {
		t.Fatalf("subjects after Setup: %v; the frozen stream was unfrozen", got)
	}
}
