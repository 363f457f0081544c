package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// Result fetches a finished job's stored result from the results bucket:
// one request to the server (the bucket's handle is kept after the first).
// Workers store the result of every job only with StoreResults on, which
// costs one more KV write per job before its reply (batched with the
// group's other results, asynchronous, acked before the job is); jobs
// submitted WithID and every Call's job are kept in any case: by ID, or,
// for a Call that travelled in a batch (ClientConfig.Batches) to a
// worker with held outcomes, in its batch's entry, which its ID names
// (see "Batches on the wire" in package jetstream's doc); Result reads
// either.
func (c *Client) Result(ctx context.Context, jobID string) ([]byte, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, err
	}
	kv, err := c.resultsBucket(ctx)
	if err != nil {
		return nil, fmt.Errorf("keylane: %w", err)
	}
	gctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	e, err := kv.Get(gctx, jobID)
	v := []byte(nil)
	if err == nil {
		v = e.Value()
	}
	if batchID, index, batched := wire.ParseBatchedJobID(jobID); batched && errors.Is(err, jetstream.ErrKeyNotFound) {
		if e, err = kv.Get(gctx, wire.BatchOutcomesKey(batchID)); err == nil {
			v, err = wire.FindBatchOutcome(e.Value(), batchID, index, jobID)
			switch {
			case errors.Is(err, wire.ErrNoBatchOutcome):
				return nil, core.ErrNoResult // the entry keeps none for this job
			case err != nil:
				return nil, fmt.Errorf("keylane: stored outcome of %s in its batch's entry: %w", jobID, err)
			}
		}
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, core.ErrNoResult
	}
	if err != nil {
		return nil, err
	}
	res, rerr, ok := core.DecodeOutcome(v)
	if !ok {
		return nil, fmt.Errorf("keylane: malformed stored result for %s", jobID)
	}
	return res, rerr
}
