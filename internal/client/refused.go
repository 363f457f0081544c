package client

import (
	"context"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publishes the server refuses (permissions): the ack never comes, and
// the server says so only on the connection (natserr.RefusalWatch, whose
// doc says how it is read and its limits). Submit, SubmitMany's waits and
// the batches' publishes end on it instead of at their deadline.

// publishWatched is publish, ended early by the server's refusal of m's
// subject.
func (c *Client) publishWatched(ctx context.Context, m *nats.Msg) (dup bool, err error) {
	wctx, stop := natserr.RefusalWatch(ctx, c.nc, c.nc.LastError(), m.Subject)
	defer stop()
	dup, err = c.publish(wctx, m)
	if r := natserr.RefusedCause(wctx); r != nil && err != nil {
		return false, r
	}
	return dup, err
}

// refusals is what SubmitMany knows of the server's refusals: the
// connection's last error before it published, and the refusal of one of
// its jobs subjects once seen.
type refusals struct {
	before, seen error
}

type pubFuture interface {
	Ok() <-chan *jetstream.PubAck
	Err() <-chan error
	Msg() *nats.Msg
}

// awaitPubAck waits for f's stream ack and returns its error (nil: stored);
// done is ctx's error, or core.ErrClosed, if the wait ended first. A publish the
// server refused never gets an ack: every natserr.RefusalCheck the wait looks for
// a refusal of a jobs subject (the connection keeps only the last one, so
// any partition's stands for all: permissions that allow some partitions
// of a namespace and not others are not supported). Once one is seen, a
// job whose ack is not in at once is taken as refused too: every publish
// went out before the first wait began, at least natserr.RefusalCheck ago.
//
// It returns the ack when ackErr and done are nil.
func (c *Client) awaitPubAck(ctx context.Context, f pubFuture, rs *refusals) (ack *jetstream.PubAck, ackErr, done error) {

	select { // most acks are in by now: no timer for them
	case ack := <-f.Ok():
		return ack, nil, nil
	case err := <-f.Err():
		return nil, err, nil
	default:
		if rs.seen != nil {
			return nil, rs.seen, nil
		}
	}
	// Any partition's refusal stands for all (the doc above): a.jobs.3.k
	// and a.jobs.2.batch both look for a.jobs. (Cut at the partition's
	// token, a refusal of another partition's publish, the last one the
	// connection kept, was never seen: a SubmitMany of two partitions
	// waited out its context.)
	subjects := f.Msg().Subject
	subjects = subjects[:max(strings.LastIndexByte(subjects, '.'), 0)]
	subjects = subjects[:strings.LastIndexByte(subjects, '.')+1] // a.jobs.
	t := time.NewTimer(natserr.RefusalCheck)
	defer t.Stop()
	for {
		select {
		case ack := <-f.Ok():
			return ack, nil, nil
		case err := <-f.Err():
			return nil, err, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-c.done:
			return nil, nil, core.ErrClosed
		case <-t.C:
			if r := natserr.Refusal(c.nc, rs.before, subjects); r != nil {
				rs.seen = r
				return nil, r, nil
			}
			t.Reset(natserr.RefusalCheck)
		}
	}
}
