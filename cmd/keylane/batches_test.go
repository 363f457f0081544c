package main

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestBatchesCommandIsGone: `keylane batches on|off` is refused with a
// clear error and touches nothing: every job travels in a batch message
// and every worker reads them. Before, turning batches on under workers
// without --batches made them step down and exit.
func TestBatchesCommandIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"batches"}, {"batches", "on"}, {"batches", "off", "--nats", "nats://127.0.0.1:1"}} {
		var out bytes.Buffer
		err := run(ctx, args, &out, &out)
		if !errors.Is(err, errBatchesGone) {
			t.Errorf("keylane %v: %v, want errBatchesGone", args, err)
		}
	}
}
