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

// TestFitShrinksTheOldestOutcomes: fit drops the oldest held outcomes
// until the entry fits, never the group's own, and refuses (permanently,
// ErrStateTooLarge) an entry that cannot fit with only those.
func TestFitShrinksTheOldestOutcomes(t *testing.T) {
	e := StateEntry{Value: []byte("v"), Seq: 100, Fence: 1, JobID: "last", Result: []byte("r")}
	for i := range 99 {
		e.Recent = append(e.Recent, AppliedResult{Seq: uint64(i + 1), ID: fmt.Sprintf("job-%03d", i), Result: bytes.Repeat([]byte{byte(i)}, 100)})
	}
	full := len(encodeState(e))
	limit := full / 2
	got, b, err := fit("k.aw", e, 10, limit)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > limit || !bytes.Equal(b, encodeState(got)) {
		t.Fatalf("%d bytes for a limit of %d", len(b), limit)
	}
	if n := len(got.Recent); n < 10 || n >= 99 || got.Recent[n-1].ID != "job-098" {
		t.Fatalf("kept %d outcomes ending %q; want the newest, at least the group's 10", n, got.Recent[n-1].ID)
	}
	// One outcome more would not fit: the cut is the smallest.
	more := got
	more.Recent = e.Recent[len(e.Recent)-len(got.Recent)-1:]
	if len(encodeState(more)) <= limit {
		t.Fatalf("kept %d outcomes where %d fit", len(got.Recent), len(more.Recent))
	}
	if _, _, err := fit("k.aw", e, 90, limit); !errors.Is(err, ErrStateTooLarge) || !errors.Is(err, ErrPermanent) {
		t.Fatalf("the group's own outcomes over the limit: %v; want a permanent ErrStateTooLarge", err)
	}
}
