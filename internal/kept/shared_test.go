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
	"github.com/nats-io/nats.go/jetstream"
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
	s.lookUps.beforeFirst = gatherAll(t, s.lookUps.waiting, n-1)
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
	inFlight(t, s.lookUps.inFlight)
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

// keepGathered has n callers keep one outcome each ("order-<i>" → "sold
// <i>") through KeepShared, the first holding its round until the others
// wait, and returns each caller's error.
func keepGathered(t *testing.T, s *Store, n int) []error {
	t.Helper()
	ctx := t.Context()
	s.keeps.beforeFirst = gatherAll(t, s.keeps.waiting, n-1)
	put := func(i int) []Put {
		return []Put{{Subject: s.Subject(fmt.Sprintf("order-%d", i)), Value: wire.EncodeOutcome(wire.OutcomeOK, []byte(fmt.Sprint("sold ", i)))}}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[0] = s.KeepShared(ctx, put(0))
	}()
	inFlight(t, s.keeps.inFlight)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.KeepShared(ctx, put(i))
		}()
	}
	wg.Wait()
	return errs
}

// TestKeepSharedGathersConcurrentGroups: with outcomes in atomic batches
// (BatchMin 2), the groups of one put each (a catalog's) that keep while
// a keep is in flight go as one atomic batch, and every outcome is
// stored, readable, and the mark is the batch's. Before, each group of
// one was a put, an ack and an fsync of its own.
func TestKeepSharedGathersConcurrentGroups(t *testing.T) {
	mem := &Memory{}
	s, kv, ctx := results(t, Config{BatchMin: 2, Memory: mem})
	const n = 30
	for i, err := range keepGathered(t, s, n) {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	if b, r := mem.Batches(), mem.SharedKeeps(); b != 1 || r != 1 {
		t.Fatalf("%d atomic batches, %d gathered rounds; want the %d gathered groups in 1 batch, 1 round", b, r, n-1)
	}
	for i := range n {
		e, err := kv.Get(ctx, fmt.Sprintf("order-%d", i))
		if err != nil {
			t.Fatalf("order-%d: %v", i, err)
		}
		if k := Value(e.Key(), nil, e.Value()); k == nil || string(k.Res) != fmt.Sprint("sold ", i) {
			t.Fatalf("order-%d: %+v", i, k)
		}
	}
	if m := s.mark.Load(); m == nil || m.seq == 0 {
		t.Fatalf("no mark after the keeps")
	}
}

// TestKeepSharedRoundRefusedGoesOneByOne: a round the results stream
// refuses as a batch (no atomic publish) stores its puts one by one, each
// caller answered nil only once its own outcome is stored; a Store
// without BatchMin keeps each group's own at once, no round.
func TestKeepSharedRoundRefusedGoesOneByOne(t *testing.T) {
	mem := &Memory{}
	s, kv, ctx := results(t, Config{BatchMin: 2, Memory: mem})
	editResults(t, s, ctx, func(sc *jetstream.StreamConfig) { sc.AllowAtomicPublish = false })
	const n = 12
	for i, err := range keepGathered(t, s, n) {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	if b, r := mem.Batches(), mem.Refused(); b != 0 || r == 0 {
		t.Fatalf("%d batches committed, %d refused; want the round refused and put one by one", b, r)
	}
	for i := range n {
		if _, err := kv.Get(ctx, fmt.Sprintf("order-%d", i)); err != nil {
			t.Fatalf("order-%d: %v", i, err)
		}
	}

	plain, kv2, _ := results(t, Config{})
	if err := plain.KeepShared(ctx, []Put{{Subject: plain.Subject("lone"), Value: wire.EncodeOutcome(wire.OutcomeOK, nil)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv2.Get(ctx, "lone"); err != nil || plain.keeps.inFlight() {
		t.Fatalf("without BatchMin: get %v, busy %v", err, plain.keeps.inFlight())
	}
}

// gatherAll returns a hook for the first caller of a round: it waits
// until want other callers wait for the next round.
func gatherAll(t *testing.T, waiting func() int, want int) func() {
	return func() {
		testwait.NoError(t, 30*time.Second, "the other groups to gather", func() error {
			if w := waiting(); w != want {
				return fmt.Errorf("%d of %d waiting", w, want)
			}
			return nil
		})
	}
}

// inFlight waits until the first caller's round is in flight.
func inFlight(t *testing.T, busy func() bool) {
	t.Helper()
	testwait.NoError(t, 30*time.Second, "the first round to be in flight", func() error {
		if !busy() {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}
