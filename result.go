package keylane

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Result fetches a finished job's stored result from the results bucket
// (workers store results only with StoreResults on).
func (c *Client) Result(ctx context.Context, jobID string) ([]byte, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	kv, err := c.js.KeyValue(ctx, c.names.Results())
	if err != nil {
		return nil, fmt.Errorf("keylane: results bucket: %w", err)
	}
	e, err := kv.Get(ctx, jobID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNoResult
	}
	if err != nil {
		return nil, err
	}
	res, rerr, ok := decodeResult(e.Value())
	if !ok {
		return nil, fmt.Errorf("keylane: malformed stored result for %s", jobID)
	}
	return res, rerr
}
