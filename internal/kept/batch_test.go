package kept

import (
	"context"
	"errors"
	"fmt"
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
		{"server before 2.12", ErrBatchIgnored, true, true, 0, 0},
		{"too large", api(10199), true, false, 50, 0},
		{"too large at 3", api(10199), true, true, 0, 3},
		{"too many in flight", api(10210), true, false, BatchMax, 0},
		{"incomplete", api(10176), true, false, BatchMax, 0},
		{"no ack in time", context.DeadlineExceeded, false, false, BatchMax, 0},
		{"no responders", nats.ErrNoResponders, false, false, BatchMax, 0},
		{"not leader", api(10074), false, false, BatchMax, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BatchRefused(fmt.Errorf("wrapped: %w", tc.err)); got != tc.refused {
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

// TestBatchStoredNeedsTheBatchInTheAck: a commit's good ack counts only if
// it names the batch and its size; a server before 2.12 acks the last
// message alone.
func TestBatchStoredNeedsTheBatchInTheAck(t *testing.T) {
	for _, tc := range []struct {
		ack  string
		want error
	}{
		{`{"stream":"KV_R","seq":7,"batch":"b1","count":3}`, nil},
		{`{"stream":"KV_R","seq":7}`, ErrBatchIgnored},
		{`{"stream":"KV_R","seq":7,"batch":"b2","count":3}`, ErrBatchIgnored},
		{`{"stream":"KV_R","seq":7,"batch":"b1","count":2}`, ErrBatchIgnored},
	} {
		if err := BatchStored(&nats.Msg{Data: []byte(tc.ack)}, "b1", 3); !errors.Is(err, tc.want) {
			t.Errorf("BatchStored(%s) = %v, want %v", tc.ack, err, tc.want)
		}
	}
	var apiErr *jetstream.APIError
	if err := BatchStored(&nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":10174,"description":"atomic publish is disabled"}}`)}, "b1", 3); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10174 {
		t.Errorf("refused batch: %v", err)
	}
}
