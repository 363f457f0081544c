package kept

import (
	"context"
	"fmt"
	"github.com/keylane/keylane/internal/jsbatch"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestKeptBatchRefusals: which server answers turn the batch form off for
// a while, which only shrink it or skip it once, and which are retried as
// batches. The codes are nats-server's (jetstream_errors_generated.go).
func TestKeptBatchRefusals(t *testing.T) {
	now := time.Now()
	api := func(code int) error { return &jetstream.APIError{Code: 400, ErrorCode: jetstream.ErrorCode(code)} }
	for _, tc := range []struct {
		name         string
		err          error
		refused, off bool
		limitAfter   int
		n            int // the refused batch's size; 0 means 100
	}{
		{"disabled", api(10174), true, true, 0, 0},
		{"server before 2.12", jsbatch.ErrIgnored, true, true, 0, 0},
		{"too large", api(10199), true, false, 50, 0},
		{"too large at 3", api(10199), true, true, 0, 3},
		{"too many in flight", api(10210), true, false, BatchMax, 0},
		{"incomplete", api(10176), true, false, BatchMax, 0},
		{"no ack in time", context.DeadlineExceeded, false, false, BatchMax, 0},
		{"no responders", nats.ErrNoResponders, false, false, BatchMax, 0},
		{"not leader", api(10074), false, false, BatchMax, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := jsbatch.Refused(fmt.Errorf("wrapped: %w", tc.err)); got != tc.refused {
				t.Fatalf("batchRefused = %v, want %v", got, tc.refused)
			}
			if !tc.refused {
				return
			}
			var k Memory
			n := tc.n
			if n == 0 {
				n = 100
			}
			if off := k.refuse(tc.err, n, now); off != tc.off {
				t.Fatalf("refuse: off = %v, want %v", off, tc.off)
			}
			if got := k.limit(now); got != tc.limitAfter {
				t.Fatalf("limit after = %d, want %d", got, tc.limitAfter)
			}
			if got := k.limit(now.Add(BatchPause)); got == 0 {
				t.Fatal("batches still off after the pause")
			}
		})
	}
}
