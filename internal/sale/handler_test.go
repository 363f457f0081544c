package sale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/inventory"
)

// TestHandlerReduce checks what Handler adds around the inventory reducer:
// the hold (cut short by the context, skipped by a failing command), the
// tracker's view of a run, and nothing at all for a job that is not a
// command.
func TestHandlerReduce(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		payload string
		wantErr error
		runs    int64
	}{
		{"applies the command", context.Background(), "buy 1", nil, 1},
		{"hold ends with the context", canceled, "buy 1", context.Canceled, 1},
		{"fail does not hold", canceled, "fail", inventory.ErrPoison, 1},
		{"bad command is not tracked", canceled, "explode", inventory.ErrBadCommand, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var trace bytes.Buffer
			h := &Handler{Inventory: &inventory.Handler{}, Hold: time.Hour, Tracker: NewTracker(&trace, "w0")}
			if tc.wantErr == nil {
				h.Hold = time.Millisecond
			}
			job := keylane.Job{ID: "j1", Key: "sku:1", Seq: 7, Fence: 3, Payload: []byte(tc.payload)}
			next, out, err := h.Reduce(tc.ctx, job, []byte("5"))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Reduce = %q, %q, %v; want error %v", next, out, err, tc.wantErr)
			}
			if tc.wantErr == nil && (string(next) != "4" || string(out) != "sold 4") {
				t.Fatalf("Reduce = %q, %q; want stock 4, result \"sold 4\"", next, out)
			}
			if got := h.Tracker.Runs(); got != tc.runs {
				t.Fatalf("tracker saw %d runs, want %d", got, tc.runs)
			}
			if trace.Len() != 0 {
				t.Fatalf("run logged before its outcome is known: %s", trace.String())
			}
			h.Committed(job, tc.wantErr == nil)
			if tc.runs == 0 {
				if trace.Len() != 0 {
					t.Fatalf("untracked run logged: %s", trace.String())
				}
				return
			}
			var s Span
			if err := json.Unmarshal(trace.Bytes(), &s); err != nil {
				t.Fatalf("trace line %q: %v", trace.String(), err)
			}
			if s.Worker != "w0" || s.Job != "j1" || s.Seq != 7 || s.Fence != 3 || s.Applied != (tc.wantErr == nil) || s.End < s.Start {
				t.Fatalf("trace line %+v", s)
			}
		})
	}
}
