package keylane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
)

// TestStateEntryOverMaxPayload: on a server whose max_payload is 8 KiB, a
// key's results (600 bytes each, all different) outgrow the entry after a
// dozen jobs with the held window of HeldBytes. The window shrinks to fit
// instead: every Call is answered, none is retried as a state-bucket
// outage for ever (on main the 14th write failed with "maximum payload
// exceeded" and the Call waited out its deadline). A job whose own value
// cannot fit at all is dead-lettered with that reason, permanently, and
// the key moves on to its next job.
func TestStateEntryOverMaxPayload(t *testing.T) {
	srv := natstest.StartConfig(t, "max_payload: 8192\n")
	nc := natstest.Connect(t, srv)
	e := newEnvOn(t, srv, nc, TopologyConfig{Partitions: 1})
	e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler = nil
		c.Reducer = ReducerFunc(func(_ context.Context, job Job, cur []byte) ([]byte, []byte, error) {
			if string(job.Payload) == "huge" {
				return bytes.Repeat([]byte("v"), 9000), []byte("ok"), nil
			}
			return []byte("small"), []byte(strings.Repeat(job.ID[len(job.ID)-2:], 300)), nil
		})
	})
	call := func(id, payload string) ([]byte, error) {
		c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return e.client.Call(c, "sku:1", []byte(payload), WithID(id))
	}
	for i := range 30 {
		id := fmt.Sprintf("order-%02d", i)
		res, err := call(id, "buy")
		if err != nil {
			t.Fatalf("call %s: %v", id, err)
		}
		if want := strings.Repeat(id[len(id)-2:], 300); string(res) != want {
			t.Fatalf("call %s: got %d bytes, want its own result", id, len(res))
		}
	}
	_, err := call("order-huge", "huge")
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "max_payload") {
		t.Fatalf("a value over max_payload: %v; want it dead-lettered saying max_payload", err)
	}
	if res, err := call("order-after", "buy"); err != nil || len(res) != 600 {
		t.Fatalf("the key's next job: %d bytes, %v; want it run", len(res), err)
	}
	entry, err := e.topo.NewState().Get(ctx(t), "sku:1")
	if err != nil {
		t.Fatal(err)
	}
	if entry.JobID != "order-after" || string(entry.Value) != "small" {
		t.Fatalf("entry: last job %q, value %q; want order-after's", entry.JobID, entry.Value)
	}
}
