package core

import (
	"errors"
	"fmt"

	"github.com/keylane/keylane/wire"
)

// The errors keylane returns. Package keylane re-exports each one under the
// same name and documents it there; the engine's rooms use them from here.
var (
	ErrPayloadTooLarge     = errors.New("keylane: payload larger than the server's max_payload")
	ErrBadJobID            = errors.New("keylane: job ID must be 1-256 characters of A-Z a-z 0-9 _ - = and single inner dots")
	ErrBadType             = wire.ErrBadType
	ErrReservedHeader      = wire.ErrReservedHeader
	ErrBadHeader           = wire.ErrBadHeader
	ErrNoReply             = errors.New("keylane: no result before the context ended")
	ErrClosed              = errors.New("keylane: client closed")
	ErrDuplicate           = errors.New("keylane: a job with this ID was stored before; nothing new stored")
	ErrPermanent           = errors.New("keylane: permanent error")
	ErrUnknownType         = errors.New("keylane: unknown job type")
	ErrNoResult            = errors.New("keylane: no stored result")
	ErrStaleFence          = errors.New("keylane: stale fence: a newer owner has written this key")
	ErrBadState            = errors.New("keylane: malformed state entry")
	ErrGap                 = errors.New("keylane: gap: a later job of this key was applied, this one never was")
	ErrEpoch               = errors.New("keylane: state written under another jobs stream (re-created?); adopt its epoch to carry the state over")
	ErrPartitionMismatch   = errors.New("keylane: partition count or hash differs from the jobs stream")
	ErrNoTopology          = errors.New("keylane: no jobs stream for the namespace: start a worker (it creates the namespace), or call Setup")
	ErrReplicasMismatch    = errors.New("keylane: replica count differs from the namespace's")
	ErrShardsMismatch      = errors.New("keylane: stream shard count differs from the namespace's")
	ErrReplyPrefixMismatch = errors.New("keylane: reply prefix differs from the namespace's")
	ErrMaxDeliverMismatch  = errors.New("keylane: MaxDeliver differs from the namespace's")
	ErrNotStarted          = errors.New("keylane: the worker has not started: its State works once Start has set the namespace up")
	ErrPayloadDropped      = errors.New("keylane: the dead letter's payload was dropped (too large); it cannot be redriven")
	ErrMalformedBatch      = errors.New("keylane: this dead letter is a malformed batch: nothing to redrive")
	ErrStateUnavailable    = errors.New("keylane: state bucket unavailable")
	ErrUnavailable         = errors.New("keylane: the applier's database is unavailable")
	ErrStateTooLarge       = errors.New("keylane: state entry larger than the server's max_payload allows")
	ErrKeyBacklogFull      = errors.New("keylane: the key's backlog is full")
	ErrOldJobsStream       = errors.New("keylane: the jobs stream was made by an older keylane (one-job messages, one subject per partition, or delayed jobs kept in the jobs stream)")
	ErrKeyBacklogMismatch  = errors.New("keylane: per-key backlog cap differs from the jobs stream's")
	ErrBadDelay            = errors.New("keylane: bad delay")
	ErrDelaysOff           = errors.New("keylane: the namespace takes no delayed jobs (create it with TopologyConfig.Delays, worker --delays)")
	ErrDelayedCall         = errors.New("keylane: Call takes no delay: Submit the delayed job, and read its outcome with Result")
	ErrHeld                = errors.New("keylane: job stored but held by the worker until an operator acts")
	ErrNoState             = errors.New("keylane: no state entry for the key")
	ErrNamespaceInUse      = errors.New("keylane: a worker holds a live lease on the namespace")
	ErrRecordRetention     = errors.New("keylane: the Applier's record retention is shorter than a job can come back")
)

// NoReplyError is keylane.NoReplyError.
type NoReplyError struct {
	JobID string
	Err   error
}

func (e *NoReplyError) Error() string {
	return fmt.Sprintf("%v (job %s): %v", ErrNoReply, e.JobID, e.Err)
}

func (e *NoReplyError) Unwrap() []error { return []error{ErrNoReply, e.Err} }

// Permanent is keylane.Permanent.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return e.err.Error() }
func (e *permanentError) Unwrap() []error      { return []error{e.err, ErrPermanent} }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// RemoteError is keylane.RemoteError.
type RemoteError struct {
	// Message is the handler's error text.
	Message string
	// Permanent reports whether the handler marked it permanent.
	Permanent bool
	// DeadLettered reports whether the job was moved to the dead-letter stream.
	DeadLettered bool
}

func (e *RemoteError) Error() string {
	if e.DeadLettered {
		return "keylane: job failed (dead-lettered): " + e.Message
	}
	return "keylane: job failed: " + e.Message
}

// Is lets errors.Is(err, ErrPermanent) see a remote permanent error.
func (e *RemoteError) Is(target error) bool { return target == ErrPermanent && e.Permanent }

// NoTopologyError is ErrNoTopology naming the namespace.
type NoTopologyError struct{ Namespace string }

func (e *NoTopologyError) Error() string {
	return fmt.Sprintf("keylane: no jobs stream for namespace %q: start a worker (it creates the namespace), or call Setup", e.Namespace)
}

func (e *NoTopologyError) Unwrap() error { return ErrNoTopology }

// StateError is a state bucket read or write that did not go through.
type StateError struct {
	Key string
	Err error
}

func (e *StateError) Error() string { return fmt.Sprintf("keylane: state %q: %v", e.Key, e.Err) }

func (e *StateError) Unwrap() []error { return []error{ErrStateUnavailable, e.Err} }
