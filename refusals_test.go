package keylane

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestStaleClientSubmitToAGonePartition: after a repartition from 4 to 2
// partitions, a client opened before it routes a key to partition 3,
// whose subject no stream has any more. Submit, Call and SubmitMany end
// at once with ErrPartitionMismatch (on main Submit retried "no response
// from stream" until its context ended).
func TestStaleClientSubmitToAGonePartition(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 4})
	if err := Repartition(ctx(t), e.js, e.ns, 2, nil); err != nil {
		t.Fatal(err)
	}
	key := keyIn(3, 4, "gone")
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.client.Submit(c, key, nil); !errors.Is(err, ErrPartitionMismatch) || c.Err() != nil {
		t.Fatalf("stale client's Submit to a gone partition: %v; want ErrPartitionMismatch", err)
	}
	if _, err := e.client.Call(c, key, nil); !errors.Is(err, ErrPartitionMismatch) || c.Err() != nil {
		t.Fatalf("stale client's Call to a gone partition: %v; want ErrPartitionMismatch", err)
	}
	out, err := e.client.SubmitMany(c, []Request{{Key: key}})
	if err != nil || !errors.Is(out[0].Err, ErrPartitionMismatch) {
		t.Fatalf("stale client's SubmitMany to a gone partition: %v, %v; want ErrPartitionMismatch", out[0].Err, err)
	}
}
