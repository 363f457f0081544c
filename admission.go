package keylane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrKeyBacklogFull is returned (as a *KeyBacklogFullError naming the key
// and the cap) by Submit, Call, SubmitMany and Redrive when the key already
// has TopologyConfig.MaxKeyBacklog jobs stored and not finished: the job
// was refused and nothing was stored. It is not retried; a shop answers it
// with "sold out / try again later". Other keys are not affected.
var ErrKeyBacklogFull = errors.New("keylane: the key's backlog is full")

// KeyBacklogFullError is ErrKeyBacklogFull for one key.
type KeyBacklogFullError struct {
	// Key is the resource key whose backlog is full.
	Key string
	// Cap is the namespace's MaxKeyBacklog: how many jobs of one key the
	// jobs stream holds at most (waiting, running or retrying).
	Cap int64
}

func (e *KeyBacklogFullError) Error() string {
	return fmt.Sprintf("key %q backlog full: it already has %d jobs waiting or running (MaxKeyBacklog); refused, nothing stored", e.Key, e.Cap)
}

func (e *KeyBacklogFullError) Unwrap() error { return ErrKeyBacklogFull }

// ErrOldJobsStream is returned when the namespace's jobs stream was made by
// a keylane before per-key subjects (one subject per partition): its jobs
// are on subjects today's workers do not read, so it is refused rather
// than half used. Drain it with the keylane that made it, then delete it
// (nats stream rm) or use another namespace.
var ErrOldJobsStream = errors.New("keylane: the jobs stream was made by an older keylane (one subject per partition, no per-key subjects)")

// ErrKeyBacklogMismatch is returned when the jobs stream's per-key backlog
// cap differs from a non-zero TopologyConfig.MaxKeyBacklog. keylane never
// changes a stream's cap: the server would delete the oldest stored jobs
// of every key over a lowered or new cap, paid orders among them.
var ErrKeyBacklogMismatch = errors.New("keylane: per-key backlog cap differs from the jobs stream's")

// subjectsVersion is the keylane.version of a jobs stream with per-key
// subjects, ns.jobs.<p>.<key token>.
const subjectsVersion = "3"

// jsErrCodeStreamStoreFailed is the server's JSStreamStoreFailedF, which
// carries the store's reason; nats.go names no constant for it.
const jsErrCodeStreamStoreFailed jetstream.ErrorCode = 10077

// backlogFull reports whether err is the server's refusal of a job over
// the per-subject limit (MaxMsgsPerSubject with DiscardNewPerSubject).
func backlogFull(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeStreamStoreFailed &&
		strings.Contains(apiErr.Description, "maximum messages per subject exceeded")
}

// refused turns the server's refusal of m over its key's backlog cap into
// a *KeyBacklogFullError, and passes any other error through. A job the
// caller may retry by ID (WithID, or any Call) whose outcome is kept was
// applied before: its retry is answered from the kept outcome (ok), not
// with "full", so a shop never says "sold out" to a purchase that went
// through (after the duplicate window, which answers such retries first).
// Only jobs marked Keylane-Idempotent (a caller's ID, or keylane's own
// second copy) cost that one results lookup; a first Call with a generated
// ID cannot have been applied, and is refused at once.
func (c *Client) refused(ctx context.Context, m *nats.Msg, err error) (res []byte, ok bool, _ error) {
	if !backlogFull(err) {
		return nil, false, err
	}
	full := &KeyBacklogFullError{Key: m.Header.Get(HeaderKey), Cap: c.maxKeyBacklog}
	if m.Header.Get(HeaderIdempotent) == "" {
		return nil, false, full
	}
	id := m.Header.Get(HeaderJobID)
	res, rerr := c.Result(ctx, id)
	switch {
	case errors.Is(rerr, ErrNoResult):
		// No outcome kept: not applied (or, after the duplicate window,
		// still queued from an earlier call, which then runs).
		return nil, false, full
	case rerr != nil && !isRemote(rerr):
		// Whether an earlier copy was applied is unknown: never say "full"
		// (nothing stored) for a purchase that may have gone through.
		return nil, false, fmt.Errorf("keylane: key %q is at its backlog cap, and whether job %s was applied before is unknown: %w", full.Key, id, rerr)
	}
	return res, true, rerr
}

func isRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}
