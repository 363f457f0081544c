package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Submit stores a job and returns its ID once JetStream has stored it. It
// does not wait for the job to run. Bad input (an empty or oversized key, an
// oversized payload, a bad job ID) is refused before anything is sent. A
// publish the server refuses (a permissions violation for the job's
// subject) ends it with that refusal, errors.Is nats.ErrPermissionViolation
// (see refused.go for how, and its limits).
func (c *Client) Submit(ctx context.Context, r *Request) (_ string, err error) {
	m, err := c.message(r, "")
	if err != nil {
		return "", err
	}
	defer c.tracing.Send(ctx, "submit", m).End(&err) // starts the span now, ends it on return
	if c.batchable(m) {
		return c.submitBatched(ctx, m, r.ID, partition.Of(r.Key, c.n))
	}
	wm, err := c.alone(m)
	if err != nil {
		return "", err
	}
	id := m.Header.Get(wire.HeaderJobID) // (sealed when alone)
	dup, err := c.publishWatched(ctx, wm)
	if err != nil {
		return c.submitError(ctx, m, id, err)
	}
	if dup {
		// A duplicate answer to a batch's first copy: another message
		// holds its (unguessable) ID; this one was not stored.
		return "", fmt.Errorf("keylane: submit %s: %w", id, errBatchIDUsed)
	}
	return id, nil
}

// submitError is the error of a submit the stream refused: a
// *core.KeyBacklogFullError over the key's cap, core.ErrDuplicate for a retry of a
// job that was applied before or is still queued, or err.
func (c *Client) submitError(ctx context.Context, m *nats.Msg, id string, err error) (string, error) {
	_, applied, err := c.refused(ctx, m, err)
	var queued *queuedError
	if applied || errors.As(err, &queued) {
		return id, fmt.Errorf("%w (job %s)", core.ErrDuplicate, id)
	}
	return "", fmt.Errorf("keylane: submit %s: %w", id, err)
}

// Submitted is the outcome of one job of SubmitMany (keylane.Submitted).
type Submitted struct {
	ID  string
	Err error
}

// SubmitMany stores many jobs with at most MaxPending asynchronous publishes
// in flight, and returns once every one is stored or refused, in the order
// given. It returns an error only if ctx ended; per-job errors are in the
// slice, and a job has a nil Err only if the stream acked it.
func (c *Client) SubmitMany(ctx context.Context, reqs []Request) (out []Submitted, err error) {
	out = make([]Submitted, len(reqs))
	futures := make([]jetstream.PubAckFuture, len(reqs))
	span := c.tracing.SendMany(ctx, len(reqs))
	defer span.End(len(out), func(i int) error { return out[i].Err })
	rs := &refusals{before: c.nc.LastError()} // a refusal after it is one of these publishes'
	var batches *manyBatches
	if c.wire != nil {
		batches = c.newManyBatches()
	}
	jobs := make([]*nats.Msg, len(reqs)) // each job sent alone, as built (futures hold what carries it)
	for i := range reqs {
		m, err := c.message(&reqs[i], "")
		out[i].ID = reqs[i].ID
		if err != nil {
			out[i].Err = err
			continue
		}
		span.Inject(m)
		if batches != nil {
			p := partition.Of(reqs[i].Key, c.n)
			if c.batchable(m) {
				batches.add(p, i, m)
				continue
			}
			batches.flush(p) // a key's earlier jobs are stored first
		}
		wm, err := c.alone(m)
		out[i].ID = m.Header.Get(wire.HeaderJobID) // sealed
		if err != nil {
			out[i].Err = err
			continue
		}
		jobs[i] = m
		f, err := c.async.PublishMsgAsync(wm, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			out[i].Err = err
			continue
		}
		futures[i] = f
		if ctx.Err() != nil {
			// The rest are not sent: say so, none may look stored.
			for j := i + 1; j < len(reqs); j++ {
				out[j] = Submitted{ID: reqs[j].ID, Err: fmt.Errorf("keylane: not submitted: %w", ctx.Err())}
			}
			if batches != nil {
				batches.drop(out, ctx.Err())
			}
			break
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		ack, err, done := c.awaitPubAck(ctx, f, rs)
		switch {
		case done != nil:
			// Every job whose ack was not seen: stored or not, unknown.
			for j := i; j < len(futures); j++ {
				if futures[j] != nil {
					out[j].Err = fmt.Errorf("keylane: submit %s: no stream ack, stored or not: %w", out[j].ID, done)
				}
			}
			if batches != nil {
				batches.abandon(out, done)
			}
			return out, done
		case err == nil && ack.Duplicate:
			// A duplicate answer to a batch of one's first copy: another
			// message holds its (unguessable) ID; this one was not stored.
			out[i].Err = fmt.Errorf("keylane: submit %s: %w", out[i].ID, errBatchIDUsed)
		case err == nil:
		case !retryablePublish(err):
			_, out[i].Err = c.submitError(ctx, jobs[i], out[i].ID, natserr.Once(err))
		default:
			// Lost with a connection or a leader: publish it again, with
			// its ID, until it is stored or ctx ends; a later copy asks
			// the worker to look its job up by ID.
			f.Msg().Header[wire.HeaderIdempotent] = oneHeader
			if _, err := c.publishWatched(ctx, f.Msg()); err != nil {
				_, out[i].Err = c.submitError(ctx, jobs[i], out[i].ID, err)
			}
		}
	}
	if batches != nil {
		if done := batches.wait(ctx, out, rs); done != nil {
			return out, done
		}
	}
	return out, ctx.Err()
}

// publish stores m and waits for the stream's ack, publishing it again with
// backoff (its job ID makes that safe) while the failure is one a
// reconnect or an election cures, until ctx ends. Each attempt is bounded.
// It reports whether the stream had the job before this call: a duplicate
// answer to the first copy; one to a later copy may be the first's own.
func (c *Client) publish(ctx context.Context, m *nats.Msg) (dup bool, err error) {
	pause := 50 * time.Millisecond
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
		ack, err := c.js.PublishMsg(actx, m)
		cancel()
		err = natserr.Once(err)
		if err == nil {
			// A duplicate answer to a copy sent again may be our own
			// first copy, whose ack was lost: stored once, by this call.
			return ack.Duplicate && try == 1, nil
		}
		if !retryablePublish(err) || ctx.Err() != nil {
			return false, err
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			if gone := c.noStream(ctx, m); gone != nil {
				return false, fmt.Errorf("%w: %w", err, gone)
			}
		}
		if try == 1 {
			// A copy that may follow an earlier one asks the worker to
			// look its ID up before running it.
			m.Header[wire.HeaderIdempotent] = oneHeader
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-c.done:
			t.Stop()
			return false, core.ErrClosed
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// retryablePublish tells failures that publishing again may cure: no
// stream leader, a timeout, a connection being re-established
// (natserr.Transient).
func retryablePublish(err error) bool { return natserr.IsTransient(err) }
