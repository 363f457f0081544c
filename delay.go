package keylane

import (
	"fmt"
	"time"

	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// MaxDelay bounds WithDelay and WithRunAt: a job runs at most 30 days
// after it is submitted.
const MaxDelay = wire.MaxDelay

// RunAtTolerance is how far in the past WithRunAt may be (clocks of
// callers and servers differ a little): such a job runs at once. Earlier
// is refused with ErrBadDelay.
const RunAtTolerance = time.Second

// WithDelay makes the job join its key's queue d from now instead of at
// once (see WithRunAt). A negative d, or one beyond MaxDelay, is refused
// with ErrBadDelay; 0 is no delay.
func WithDelay(d time.Duration) SubmitOpt {
	return func(r *Request) {
		if d < 0 || d > MaxDelay {
			r.optErr = fmt.Errorf("%w: delay %s must be 0 to %s", ErrBadDelay, d, MaxDelay)
			return
		}
		if d > 0 {
			r.RunAt = time.Now().Add(d)
		}
	}
}

// WithRunAt makes the job join its key's queue at t instead of at once:
// the server stores it until then (it survives worker and server
// restarts), then on its key's subject, so it runs after the key's jobs
// that arrived before t and before those that arrive after; never before
// t, and once. A t in the past by at most RunAtTolerance runs at once;
// earlier, or beyond MaxDelay from now, is refused with ErrBadDelay. The
// namespace must have been created with TopologyConfig.Delays.
func WithRunAt(t time.Time) SubmitOpt {
	return func(r *Request) { r.RunAt = t }
}

// HeaderDelayedID carries a delayed job's ID on its due copy: the server
// leaves Nats-Msg-Id out of the message it stores when a schedule fires.
const HeaderDelayedID = wire.HeaderDelayedID

// HeaderRunAt carries a delayed job's time on its submission.
const HeaderRunAt = wire.HeaderRunAt

// delay turns m, a job of key in partition p, into the submission of a
// delayed job due at r.RunAt, or leaves m as it is when the job is due
// now. It refuses what ErrBadDelay and ErrDelaysOff say. The submission
// is a plain message on the partition's delay subject in the jobs stream
// (its ID in Nats-Msg-Id, so a retried submit is dropped); the
// partition's owner moves it into the delays stream as a schedule (see
// jetstream/doc.go, "Delayed jobs").
func (c *Client) delay(r *Request, m *nats.Msg, p int) error {
	if r.optErr != nil {
		return r.optErr
	}
	if r.RunAt.IsZero() {
		return nil
	}
	until := time.Until(r.RunAt)
	switch {
	case until < -RunAtTolerance:
		return fmt.Errorf("%w: run-at %s is %s in the past (tolerance %s)", ErrBadDelay, r.RunAt.Format(time.RFC3339Nano), -until, RunAtTolerance)
	case until > MaxDelay:
		return fmt.Errorf("%w: run-at %s is beyond %s from now", ErrBadDelay, r.RunAt.Format(time.RFC3339Nano), MaxDelay)
	case until <= 0:
		return nil // due: it runs at once
	case !c.delays:
		return fmt.Errorf("%w: namespace %s", ErrDelaysOff, c.names.Namespace)
	}
	m.Header[HeaderRunAt] = []string{r.RunAt.UTC().Format(time.RFC3339Nano)}
	m.Subject = partition.DelaySubject(c.names.Namespace, p, r.ID)
	return nil
}
