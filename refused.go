package keylane

import (
	"context"
	"fmt"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go"
)

// Publishes the server refuses: internal/natserr's refusal watch (its
// doc says how, and its limits), which the client's Submit and Call use
// too; here, a worker's start.

// apiSubjects stands for every subject a worker's start publishes to
// (natserr.APISubjects).
const apiSubjects = natserr.APISubjects

func refusalWatch(ctx context.Context, nc *nats.Conn, before error, subject string) (context.Context, func()) {
	return natserr.RefusalWatch(ctx, nc, before, subject)
}

// startRefused says why Worker.Start failed when the server refused one
// of its requests (any subject) since before: the request itself only
// timed out, or ended with ctx, a refusalWatch's.
func startRefused(ctx context.Context, nc *nats.Conn, before, err error) error {
	if err == nil {
		return nil
	}
	r := natserr.RefusedCause(ctx)
	if r == nil {
		r = natserr.Refusal(nc, before, apiSubjects)
	}
	if r == nil {
		return err
	}
	return fmt.Errorf("keylane: start: %w; %w", r, err)
}
