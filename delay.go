package keylane

import (
	"fmt"
	"time"

	"github.com/keylane/keylane/internal/client"
	"github.com/keylane/keylane/wire"
)

// MaxDelay bounds WithDelay and WithRunAt: a job runs at most 30 days
// after it is submitted.
const MaxDelay = wire.MaxDelay

// RunAtTolerance is how far in the past WithRunAt may be (clocks of
// callers and servers differ a little): such a job runs at once. Earlier
// is refused with ErrBadDelay.
const RunAtTolerance = client.RunAtTolerance

// WithDelay makes the job join its key's queue d from now instead of at
// once (see WithRunAt). A negative d, or one beyond MaxDelay, is refused
// with ErrBadDelay; 0 is no delay.
func WithDelay(d time.Duration) SubmitOpt {
	return func(r *Request) {
		if d < 0 || d > MaxDelay {
			client.SetOptErr(r, fmt.Errorf("%w: delay %s must be 0 to %s", ErrBadDelay, d, MaxDelay), false)
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
