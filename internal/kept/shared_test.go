package kept

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestLookUpSharedGathersConcurrentGroups: groups of one ID each (a
// catalog's groups) that ask while a look-up is in flight go in one
// batched request, and each gets its own ID's answer from it: found,
// none kept. Before, each asked alone (a leader get per job).
func TestLookUpSharedGathersConcurrentGroups(t *testing.T) {
	mem := &Memory{}
	s, kv, ctx := results(t, Config{Memory: mem})
	const n = 40
	for i := range n {
		if i%2 == 0 {
			if _, err := kv.Put(ctx, fmt.Sprintf("order-%d", i), wire.EncodeOutcome(wire.OutcomeOK, []byte(fmt.Sprint("sold ", i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Count the batched requests the server is sent.
	var requests atomic.Int64
	sub, err := s.nc.Subscribe("$JS.API.DIRECT.GET."+s.stream, func(*nats.Msg) { requests.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// The first caller holds its round until every other caller waits.
	s.rounds.beforeFirst = func() {
		testwait.NoError(t, 30*time.Second, "the other groups to gather", func() error {
			s.rounds.mu.Lock()
			defer s.rounds.mu.Unlock()
			if w := 0; s.rounds.next != nil {
				w = s.rounds.next.waiters
				if w == n-1 {
					return nil
				}
				return fmt.Errorf("%d of %d waiting", w, n-1)
			}
			return fmt.Errorf("none waiting")
		})
	}
	got := make([]map[string]*Outcome, n)
	var wg sync.WaitGroup
	first := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		close(first)
		got[0] = s.LookUpShared(ctx, []string{"order-0"})
	}()
	<-first
	testwait.NoError(t, 30*time.Second, "the first round to be in flight", func() error {
		s.rounds.mu.Lock()
		defer s.rounds.mu.Unlock()
		if !s.rounds.busy {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = s.LookUpShared(ctx, []string{fmt.Sprintf("order-%d", i)})
		}()
	}
	wg.Wait()

	if got[0] != nil {
		t.Fatalf("the first caller's lone ID settled %v; want it left to the per-ID look-up", got[0])
	}
	for i := 1; i < n; i++ {
		id := fmt.Sprintf("order-%d", i)
		k, ok := got[i][id]
		switch {
		case !ok:
			t.Fatalf("%s not settled", id)
		case i%2 == 0 && (k == nil || string(k.Res) != fmt.Sprint("sold ", i)):
			t.Fatalf("%s: %+v, want its kept outcome", id, k)
		case i%2 == 1 && k != nil:
			t.Fatalf("%s: %+v, want none kept", id, k)
		}
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if r := requests.Load(); r != 1 {
		t.Fatalf("%d batched requests for %d gathered groups; want 1", r, n-1)
	}
	if r := mem.SharedRounds(); r != 1 {
		t.Fatalf("SharedRounds %d, want 1", r)
	}
}
