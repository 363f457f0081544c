package keylane

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestDeleteNamespaceInUse: DeleteNamespace refuses with
// ErrNamespaceInUse, deleting nothing, while a worker holds a lease;
// with force it deletes every stream of the namespace, and only those.
// A stream named like a shard of it whose subjects are another's is not
// listed; a jobs stream of another namespace that shares its names
// ("a-b" and "a_b") makes it refuse.
func TestDeleteNamespaceInUse(t *testing.T) {
	e := newEnv(t, TopologyConfig{Namespace: "inuse", Partitions: 2})
	w := e.worker("w", HandlerFunc(func(context.Context, Job) ([]byte, error) { return nil, nil }), nil)
	e.waitOwned(w)
	if _, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "inuse2", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	before, err := NamespaceObjects(ctx(t), e.js, "inuse")
	if err != nil || len(before) != 6 {
		t.Fatalf("objects of inuse: %v, %v", before, err)
	}
	if _, err := DeleteNamespace(ctx(t), e.js, "inuse", false); !errors.Is(err, ErrNamespaceInUse) {
		t.Fatalf("delete while a worker holds leases: %v", err)
	}
	if after, _ := NamespaceObjects(ctx(t), e.js, "inuse"); !slices.Equal(after, before) {
		t.Fatalf("refused, yet %v became %v", before, after)
	}
	deleted, err := DeleteNamespace(ctx(t), e.js, "inuse", true)
	if err != nil || !slices.Equal(deleted, before) {
		t.Fatalf("forced delete: %v, %v; want %v", deleted, err, before)
	}
	if after, err := NamespaceObjects(ctx(t), e.js, "inuse"); err != nil || len(after) != 0 {
		t.Fatalf("after the delete: %v, %v", after, err)
	}
	if other, err := NamespaceObjects(ctx(t), e.js, "inuse2"); err != nil || len(other) != 6 {
		t.Fatalf("inuse2 after deleting inuse: %v, %v", other, err)
	}
	if _, err := DeleteNamespace(ctx(t), e.js, "inuse", true); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("deleting it again: %v", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = w.Stop(sctx) // its streams are gone: its stop may fail

	if _, err := Setup(ctx(t), e.js, TopologyConfig{Namespace: "a-b", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := NamespaceObjects(ctx(t), e.js, "a_b"); err == nil {
		t.Fatal("a_b listed a-b's streams as its own")
	}
	if _, err := e.js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "INUSE2_JOBS_X", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	if objs, err := NamespaceObjects(ctx(t), e.js, "inuse2"); err != nil || slices.Contains(objs, "INUSE2_JOBS_X") {
		t.Fatalf("inuse2's objects with a look-alike stream: %v, %v", objs, err)
	}
}
