package keylane

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestGapThroughAWorkerIsDeadLettered: a job whose key's state says a
// later job was applied, with this one's outcome not held (its earlier
// run lost, the stream's sequence reset under the state), is refused
// with ErrGap through a running worker: dead-lettered, loud, never
// applied. Its Call gets a dead-lettered RemoteError naming the gap, the
// reducer never runs, the key's state is as it was, and the dead letter
// says why. (The state store's side: internal/statestore
// TestStateAppliesJobsOfOneBatchInOrder; this is the tenure's.)
func TestGapThroughAWorkerIsDeadLettered(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	const key = "gap-key"
	st := e.topo.NewState()
	// The key's state as a later job left it: applied up to seq 1000.
	if _, err := st.Apply(ctx(t), Job{ID: "later", Key: key, Seq: 1000, Partition: 0, Fence: 1}, func([]byte) ([]byte, []byte, error) {
		return []byte("7"), []byte("n=7"), nil
	}); err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	w := reducerWorker(e, "w1", c)

	_, err := e.client.Call(ctx(t), key, []byte("x"), WithID("lost-1"))
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "gap") {
		t.Fatalf("Call of a job below its key's applied sequence: %v; want a dead-lettered RemoteError naming the gap", err)
	}
	c.mu.Lock()
	runs := c.running[key] + c.applied["lost-1"]
	c.mu.Unlock()
	if runs != 0 {
		t.Fatalf("the reducer ran the gapped job (%d)", runs)
	}
	if g := w.Stats().Gaps; g != 1 {
		t.Fatalf("Stats().Gaps = %d, want 1", g)
	}
	got, err := st.Get(ctx(t), key)
	if err != nil || string(got.Value) != "7" || got.Seq != 1000 {
		t.Fatalf("state after the gap: %+v, %v; want value 7 at seq 1000, unchanged", got, err)
	}
	dead := e.deadLetters()
	if len(dead) != 1 || !strings.Contains(dead[0].Header.Get(HeaderError), "gap") {
		t.Fatalf("dead letters: %d, first error %q; want one naming the gap", len(dead), firstError(dead))
	}
}

// firstError is the first dead letter's error header, "" when none.
func firstError(dead []*jetstream.RawStreamMsg) string {
	if len(dead) == 0 {
		return ""
	}
	return dead[0].Header.Get(HeaderError)
}
