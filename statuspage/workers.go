package statuspage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// Worker is a live worker as its member entry says: each worker holds a
// lease on its ID in the namespace's members bucket and renews it every
// third of the lease TTL; the entry expires a TTL after its last renew.
type Worker struct {
	ID string
	// Host and Version are where the worker runs and its keylane build,
	// as its member entry says (empty for a worker of an earlier build).
	Host, Version string `json:",omitempty"`
	// Started is when the worker joined (its member lease's Create), by
	// the worker's clock.
	Started time.Time
	// Heartbeat is when its member entry was last written (its last
	// renew), by the server's clock.
	Heartbeat time.Time
	// Partitions are the partitions it owns.
	Partitions []int `json:",omitempty"`
}

// readWorkers reads the members bucket's entries: one per live worker.
func readWorkers(ctx context.Context, js jetstream.JetStream, namespace string, st *keylane.Status) ([]Worker, error) {
	kv, err := js.KeyValue(ctx, keylane.Names{Namespace: namespace}.Members())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("members bucket: %w", err)
	}
	var ws []Worker
	for _, id := range st.Members {
		e, err := kv.Get(ctx, id)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // it left since Inspect read the keys
		}
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", id, err)
		}
		w := Worker{ID: id, Heartbeat: e.Created()}
		if info, err := lease.Decode(e.Value()); err == nil {
			w.Started, w.Host, w.Version = info.AcquiredAt, info.Host, info.Version
		}
		for _, p := range st.Partition {
			if p.Owner == id {
				w.Partitions = append(w.Partitions, p.Partition)
			}
		}
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b Worker) int { return a.Started.Compare(b.Started) })
	return ws, nil
}
