package keylane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publishes the server refuses.
//
// A publish to a subject the user may not publish to is dropped by the
// server, which says so only asynchronously: a "-ERR Permissions Violation
// for Publish to …" that nats.go hands to the connection's error handler
// and keeps as its LastError. The ack the caller waits for never comes, so
// without a look at the connection a refused Submit or Call would wait
// until its context ends, and a refused Worker.Start until its first
// JetStream request times out.
//
// The connection is the user's, with the user's handlers: keylane does not
// replace them. It reads nc.LastError() instead, every refusalCheck while
// an ack is late, and takes a permissions violation that is new since the
// call began (another error value than the one read before publishing)
// and names the call's subject as the call's refusal. The limits: a
// refusal is seen only while it is the connection's last error (another
// error reported in the same instant can hide it, and a reconnect clears
// it; the call then ends as it did before, with its context), and a call
// takes up to one refusalCheck (Call: its first ack wait) to notice.

// refusalCheck is how often a late ack looks for the server's refusal.
const refusalCheck = 200 * time.Millisecond

// apiSubjects stands for every subject a worker's start publishes to (the
// JetStream API, $JS.API.…, and KV writes, $KV.…): a refusal of a job
// subject, left on a connection the worker shares with a client, is not
// the start's.
const apiSubjects = "$"

// refusal returns the server's permissions violation for a publish to
// subject ("" for any subject; a subject ending in "." or apiSubjects for
// any under it)
// that nc reported since before (its LastError when the call began), or
// nil.
func refusal(nc *nats.Conn, before error, subject string) error {
	last := nc.LastError()
	if last == nil || !errors.Is(last, nats.ErrPermissionViolation) || last == before {
		return nil
	}
	what := `Publish to "` + subject
	if !strings.HasSuffix(subject, ".") && subject != apiSubjects {
		what += `"`
	}
	if subject != "" && !strings.Contains(last.Error(), what) {
		return nil
	}
	return fmt.Errorf("refused by the server: %w", last)
}

// refusalWatch returns a context that ends, with the refusal as its
// cause, once the server refuses a publish to subject ("" for any) after
// before, and a function that stops the watch. The watch costs one timer,
// which does not fire while acks come in time.
func refusalWatch(ctx context.Context, nc *nats.Conn, before error, subject string) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(refusalCheck, func() {
		if err := refusal(nc, before, subject); err != nil {
			cancel(err)
			return
		}
		mu.Lock()
		if !stopped {
			t.Reset(refusalCheck)
		}
		mu.Unlock()
	})
	mu.Unlock()
	return wctx, func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// refusedCause returns why ctx (a refusalWatch's) ended if the server's
// refusal ended it, or nil.
func refusedCause(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, nats.ErrPermissionViolation) {
		return cause
	}
	return nil
}

// publishWatched is publish, ended early by the server's refusal of m's
// subject.
func (c *Client) publishWatched(ctx context.Context, m *nats.Msg) (dup bool, err error) {
	wctx, stop := refusalWatch(ctx, c.nc, c.nc.LastError(), m.Subject)
	defer stop()
	dup, err = c.publish(wctx, m)
	if r := refusedCause(wctx); r != nil && err != nil {
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

// awaitAck waits for f's stream ack and returns its error (nil: stored);
// done is ctx's error, or ErrClosed, if the wait ended first. A publish the
// server refused never gets an ack: every refusalCheck the wait looks for
// a refusal of a jobs subject (the connection keeps only the last one, so
// any partition's stands for all: permissions that allow some partitions
// of a namespace and not others are not supported). Once one is seen, a
// job whose ack is not in at once is taken as refused too: every publish
// went out before the first wait began, at least refusalCheck ago.
func (c *Client) awaitAck(ctx context.Context, f pubFuture, rs *refusals) (ackErr, done error) {
	_, ackErr, done = c.awaitPubAck(ctx, f, rs)
	return ackErr, done
}

type pubFuture interface {
	Ok() <-chan *jetstream.PubAck
	Err() <-chan error
	Msg() *nats.Msg
}

// awaitPubAck is awaitAck, with the ack when ackErr and done are nil.
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
	t := time.NewTimer(refusalCheck)
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
			return nil, nil, ErrClosed
		case <-t.C:
			if r := refusal(c.nc, rs.before, subjects); r != nil {
				rs.seen = r
				return nil, r, nil
			}
			t.Reset(refusalCheck)
		}
	}
}

// startRefused says why Worker.Start failed when the server refused one
// of its requests (any subject) since before: the request itself only
// timed out, or ended with ctx, a refusalWatch's.
func startRefused(ctx context.Context, nc *nats.Conn, before, err error) error {
	if err == nil {
		return nil
	}
	r := refusedCause(ctx)
	if r == nil {
		r = refusal(nc, before, apiSubjects)
	}
	if r == nil {
		return err
	}
	return fmt.Errorf("keylane: start: %w; %w", r, err)
}
