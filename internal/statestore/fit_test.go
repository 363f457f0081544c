package statestore

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/keylane/keylane/internal/core"
)

// TestFitShrinksTheOldestOutcomes: fit drops the oldest held outcomes
// until the entry fits, never the group's own, and refuses (permanently,
// core.ErrStateTooLarge) an entry that cannot fit with only those.
func TestFitShrinksTheOldestOutcomes(t *testing.T) {
	e := Entry{Value: []byte("v"), Seq: 100, Fence: 1, JobID: "last", Result: []byte("r")}
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
	if _, _, err := fit("k.aw", e, 90, limit); !errors.Is(err, core.ErrStateTooLarge) || !errors.Is(err, core.ErrPermanent) {
		t.Fatalf("the group's own outcomes over the limit: %v; want a permanent core.ErrStateTooLarge", err)
	}
}
