package keylane

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoResult is returned by Client.Result when no result is stored for the
// job (it has not finished, results are not stored, or the result expired).
var ErrNoResult = errors.New("keylane: no stored result")

const (
	resultOK   = 'o'
	resultErr  = 'e'
	resultPerm = 'p'
	resultDead = 'd'
)

func encodeResult(res []byte, err error, dead bool) []byte {
	if err == nil {
		return append([]byte{resultOK}, res...)
	}
	kind := byte(resultErr)
	switch errorKind(err, dead) {
	case "dead":
		kind = resultDead
	case "permanent":
		kind = resultPerm
	}
	return append([]byte{kind}, err.Error()...)
}

func decodeResult(b []byte) ([]byte, error, bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	switch b[0] {
	case resultOK:
		return b[1:], nil, true
	case resultErr, resultPerm, resultDead:
		return nil, &RemoteError{Message: string(b[1:]), Permanent: b[0] != resultErr, DeadLettered: b[0] == resultDead}, true
	}
	return nil, nil, false
}

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
