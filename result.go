package keylane

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Result fetches a finished job's stored result from the results bucket:
// one request to the server (the bucket's handle is kept after the first).
// Workers store the result of every job only with StoreResults on, which
// costs one more KV write per job before its reply (batched with the
// group's other results, asynchronous, acked before the job is); jobs
// submitted WithID and every Call's job are kept by ID in any case.
func (c *Client) Result(ctx context.Context, jobID string) ([]byte, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	kv, err := c.resultsBucket(ctx)
	if err != nil {
		return nil, fmt.Errorf("keylane: %w", err)
	}
	gctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	e, err := kv.Get(gctx, jobID)
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
