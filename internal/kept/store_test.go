package kept

import (
	"context"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/namespace"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// results starts a server with a results bucket as Setup leaves it (direct
// gets, atomic batches) and returns a Store on it, the bucket and a
// context for the test.
func results(t *testing.T, cfg Config) (*Store, jetstream.KeyValue, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "NS_RESULTS"})
	if err != nil {
		t.Fatal(err)
	}
	if kv, err = namespace.EnsureDirectGets(ctx, js, kv); err != nil {
		t.Fatal(err)
	}
	if err := namespace.AllowAtomicPublish(ctx, js, "KV_NS_RESULTS"); err != nil {
		t.Fatal(err)
	}
	cfg.NC, cfg.JS, cfg.Results = nc, js, "NS_RESULTS"
	return New(cfg), kv, ctx
}

// editResults changes the results stream's configuration as edit says,
// as an operator may on a running namespace.
func editResults(t *testing.T, s *Store, ctx context.Context, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	edit(&sc)
	if _, err := s.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
}

// TestStoreLookUp: one batched request settles a group's IDs from a
// current answer: a kept outcome (a dead letter's too), none kept for a
// deleted or never written ID, an *UnreadableError for a value that does
// not decode; a lone ID is left to the per-ID look-up. Behind the mark,
// only the outcomes a stale replica cannot get wrong are settled.
func TestStoreLookUp(t *testing.T) {
	s, kv, ctx := results(t, Config{})
	put := func(id string, v []byte) {
		t.Helper()
		if _, err := kv.Put(ctx, id, v); err != nil {
			t.Fatal(err)
		}
	}
	put("a", wire.EncodeOutcome(wire.OutcomeOK, []byte("done")))
	put("b", wire.EncodeOutcome(wire.OutcomeDead, []byte("poison")))
	put("c", wire.EncodeOutcome(wire.OutcomeOK, []byte("gone")))
	if err := kv.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	put("e", []byte{0xff, 0xfe})

	if got := s.LookUp(ctx, []string{"a"}); got != nil {
		t.Fatalf("a lone ID settled %v; want it left to the per-ID look-up", got)
	}
	got := s.LookUp(ctx, []string{"a", "b", "c", "d", "e", "a"})
	if k := got["a"]; k == nil || string(k.Res) != "done" || k.Err != nil {
		t.Fatalf("a: %+v, want done", k)
	}
	var re *core.RemoteError
	if k := got["b"]; k == nil || !errors.As(k.Err, &re) || !re.DeadLettered {
		t.Fatalf("b: %+v, want a dead letter's outcome", k)
	}
	for _, id := range []string{"c", "d"} {
		if k, ok := got[id]; !ok || k != nil {
			t.Fatalf("%s: %+v (settled %v), want none kept", id, k, ok)
		}
	}
	var bad *UnreadableError
	if k := got["e"]; k == nil || !errors.As(k.Err, &bad) || bad.ID != "e" {
		t.Fatalf("e: %+v, want an unreadable outcome", k)
	}

	// A mark no replica has reached: "none kept" and a dead letter's
	// outcome are no longer definite; a plain kept outcome still is.
	s.NoteKept(s.Subject("a"), 1<<40)
	got = s.LookUp(ctx, []string{"a", "b", "c", "d"})
	if k := got["a"]; k == nil || string(k.Res) != "done" {
		t.Fatalf("behind the mark, a: %+v, want done", k)
	}
	for _, id := range []string{"b", "c", "d"} {
		if k, ok := got[id]; ok {
			t.Fatalf("behind the mark, %s settled as %+v; want it left to the leader", id, k)
		}
	}
}

// TestStoreKeepBatched: a group of at least BatchMin puts goes as one
// atomic batch, its values readable and its commit the mark; a smaller one
// is left to single puts.
func TestStoreKeepBatched(t *testing.T) {
	mem := &Memory{}
	s, kv, ctx := results(t, Config{BatchMin: 2, Memory: mem})
	if sent, err := s.KeepBatched(ctx, []Put{{Subject: s.Subject("x"), Value: []byte("1")}}); sent || err != nil {
		t.Fatalf("one put: sent %v, err %v; want it left to a single put", sent, err)
	}
	puts := []Put{{s.Subject("p"), []byte("1")}, {s.Subject("q"), []byte("2")}, {s.Subject("r"), []byte("3")}}
	if sent, err := s.KeepBatched(ctx, puts); !sent || err != nil {
		t.Fatalf("sent %v, err %v; want one batch", sent, err)
	}
	if mem.Batches() != 1 || mem.Refused() != 0 {
		t.Fatalf("%d batches, %d refused; want 1, 0", mem.Batches(), mem.Refused())
	}
	for _, p := range puts {
		e, err := kv.Get(ctx, p.Subject[len(s.prefix):])
		if err != nil || string(e.Value()) != string(p.Value) {
			t.Fatalf("%s: %v %v", p.Subject, e, err)
		}
	}
	if m := s.mark.Load(); m == nil || m.subject != s.Subject("r") {
		t.Fatalf("mark %+v, want the batch's last put", m)
	}
}

// TestStoreBatchEntryIsBoundToItsMessage: an entry is written only over
// the revision its writer read; its own message writes over it again
// (after a lost ack: a stale revision), another message never does.
// Read with leader gets (a replicated results stream) and with direct
// gets (one replica: Config.Single) alike.
func TestStoreBatchEntryIsBoundToItsMessage(t *testing.T) {
	for _, single := range []bool{false, true} {
		t.Run(fmt.Sprintf("single=%v", single), func(t *testing.T) {
			s, _, ctx := results(t, Config{Single: single})
			testEntryIsBound(t, s, ctx)
		})
	}
}

// TestEntryReadFallsBackToTheLeader: on a one-replica results stream
// whose direct gets are not allowed (a stream an operator edited), a
// batch entry's read is asked of the leader: the entry is found, never
// taken for none, and a read of none is still none.
func TestEntryReadFallsBackToTheLeader(t *testing.T) {
	s, _, ctx := results(t, Config{Single: true})
	const id = "T3stBatch0000000000002"
	a, b := BatchOrigin("JOBS", 1, 8), BatchOrigin("JOBS_1", 1, 8)
	if _, err := s.PutEntry(ctx, id, a, 0, []byte("first")); err != nil {
		t.Fatal(err)
	}
	editResults(t, s, ctx, func(sc *jetstream.StreamConfig) { sc.AllowDirect = false })
	if _, takenBy, err := s.EntryRev(ctx, id, b); takenBy != a || err != nil {
		t.Fatalf("without direct gets: taken by %q, %v; want %q", takenBy, err, a)
	}
	if data, err := s.ReadEntry(ctx, id); string(data) != "first" || err != nil {
		t.Fatalf("without direct gets: entry %q, %v; want first", data, err)
	}
	if rev, takenBy, err := s.EntryRev(ctx, "T3stBatch0000000000003", b); rev != 0 || takenBy != "" || err != nil {
		t.Fatalf("without direct gets, no entry: rev %d, taken by %q, %v", rev, takenBy, err)
	}
}

func testEntryIsBound(t *testing.T, s *Store, ctx context.Context) {
	t.Helper()
	const id = "T3stBatch0000000000001"
	a, b := BatchOrigin("JOBS", 1, 7), BatchOrigin("JOBS_1", 1, 7)
	if data, err := s.ReadEntry(ctx, id); data != nil || err != nil {
		t.Fatalf("no entry read as %q, %v", data, err)
	}
	if rev, takenBy, err := s.EntryRev(ctx, id, a); rev != 0 || takenBy != "" || err != nil {
		t.Fatalf("no entry: rev %d, taken by %q, %v", rev, takenBy, err)
	}
	rev, err := s.PutEntry(ctx, id, a, 0, []byte("first"))
	if err != nil || rev == 0 {
		t.Fatalf("first write: rev %d, %v", rev, err)
	}
	if got, _, err := s.EntryRev(ctx, id, a); got != rev || err != nil {
		t.Fatalf("its own entry: rev %d, %v; want %d", got, err, rev)
	}
	again, err := s.PutEntry(ctx, id, a, 0, []byte("again"))
	if err != nil || again <= rev {
		t.Fatalf("its own message again over a stale revision: rev %d, %v", again, err)
	}
	if _, err := s.PutEntry(ctx, id, b, 0, []byte("forged")); !errors.Is(err, ErrBatchIDTaken) {
		t.Fatalf("another message's write: %v, want ErrBatchIDTaken", err)
	}
	if _, takenBy, err := s.EntryRev(ctx, id, b); takenBy != a || err != nil {
		t.Fatalf("taken by %q, %v; want %q", takenBy, err, a)
	}
	if data, err := s.ReadEntry(ctx, id); string(data) != "again" || err != nil {
		t.Fatalf("entry %q, %v; want again", data, err)
	}
}
