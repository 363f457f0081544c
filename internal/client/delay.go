package client

import (
	"fmt"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// RunAtTolerance is how far in the past WithRunAt may be (clocks of
// callers and servers differ a little): such a job runs at once. Earlier
// is refused with core.ErrBadDelay.
const RunAtTolerance = time.Second

// delay turns m, a job of key in partition p, into the submission of a
// delayed job due at r.RunAt, or leaves m as it is when the job is due
// now. It refuses what core.ErrBadDelay and core.ErrDelaysOff say. The submission
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
		return fmt.Errorf("%w: run-at %s is %s in the past (tolerance %s)", core.ErrBadDelay, r.RunAt.Format(time.RFC3339Nano), -until, RunAtTolerance)
	case until > wire.MaxDelay:
		return fmt.Errorf("%w: run-at %s is beyond %s from now", core.ErrBadDelay, r.RunAt.Format(time.RFC3339Nano), wire.MaxDelay)
	case until <= 0:
		return nil // due: it runs at once
	case !c.delays:
		return fmt.Errorf("%w: namespace %s", core.ErrDelaysOff, c.cfg.Namespace)
	}
	m.Header[wire.HeaderRunAt] = []string{r.RunAt.UTC().Format(time.RFC3339Nano)}
	m.Subject = partition.DelaySubject(c.cfg.Namespace, p, r.ID)
	return nil
}
