package core

import (
	"fmt"
)

// The client's errors and reply vocabulary that the worker shares
// (internal/client builds them, the root aliases them, the worker sends
// what they decode).

// KeyBacklogFullError is keylane.KeyBacklogFullError.
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

// HeldError is keylane.HeldError.
type HeldError struct {
	// JobID is the held job's ID: call again with it for its outcome.
	JobID string
	// Reason is the worker's: why the job is held and what releases it.
	Reason string
	// epoch: held for ErrEpoch.
	epoch bool
}

// NewHeldError is the HeldError of job id, held for reason; epoch: held
// for ErrEpoch (it is errors.Is ErrEpoch too).
func NewHeldError(id, reason string, epoch bool) *HeldError {
	return &HeldError{JobID: id, Reason: reason, epoch: epoch}
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("keylane: job %s is stored but held, not run: %s; call again with the same ID for its outcome once it runs", e.JobID, e.Reason)
}

func (e *HeldError) Unwrap() []error {
	if e.epoch {
		return []error{ErrHeld, ErrNoReply, ErrEpoch}
	}
	return []error{ErrHeld, ErrNoReply}
}

// HeldMark starts the inbox token of a held notice: HeldMark and the
// Call's own reply token. Neither base 36, the client's ack prefix nor
// wire.GroupedMark holds it.
const HeldMark = "="

// HeldKindEpoch is the Keylane-Error-Kind of a notice for a job held for
// ErrEpoch.
const HeldKindEpoch = "held-epoch"

// ErrorText is a reply's error text, never empty (a client before the
// client's reply check read an empty Keylane-Error as a success).
func ErrorText(s string) string {
	if s == "" {
		return "(no error text)"
	}
	return s
}
