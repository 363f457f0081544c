package keylane

import (
	"errors"
	"fmt"

	"github.com/keylane/keylane/wire"
)

// The errors keylane returns, in one place.

var (
	// ErrPayloadTooLarge is returned for a job larger than the server's
	// max_payload; nothing is sent.
	ErrPayloadTooLarge = errors.New("keylane: payload larger than the server's max_payload")
	// ErrBadJobID is returned for a job ID keylane cannot carry.
	ErrBadJobID = errors.New("keylane: job ID must be 1-256 characters of A-Z a-z 0-9 _ - = and single inner dots")
	// ErrBadType is returned for a job type keylane cannot carry (see
	// package wire); nothing is stored.
	ErrBadType = wire.ErrBadType
	// ErrReservedHeader is returned for a header of WithHeader or
	// Request.Headers under Nats-* or Keylane-* (any case), or named Status
	// or Description; nothing is stored.
	ErrReservedHeader = wire.ErrReservedHeader
	// ErrBadHeader is returned for a header name nats.go cannot send, or a
	// value that would not arrive as sent; nothing is stored.
	ErrBadHeader = wire.ErrBadHeader
	// ErrNoReply is returned (as a *NoReplyError naming the job) by Call
	// when ctx ended before the job's outcome came. Call does not wait for
	// the stream's ack before the outcome, so the job may or may not have
	// been stored: call again with the same WithID to get its outcome
	// without running it twice.
	ErrNoReply = errors.New("keylane: no result before the context ended")
	// ErrClosed is returned by calls made after Close, and by Calls (and
	// Submits retrying a publish) that were still waiting when it ran.
	ErrClosed = errors.New("keylane: client closed")
)

// ErrDuplicate is returned by Submit (with the job's ID) when the stream
// already stored a job with this ID and said so: nothing new was stored.
// Only a job that goes as a one-job message can get it (a delayed job, a
// redrive, a job on a namespace with a key backlog cap). A job in a batch
// message (every other) with a caller's ID that ran before is stored
// again and answered by the worker from its kept outcome, never run
// twice: Submit returns nil for it.
var ErrDuplicate = errors.New("keylane: a job with this ID was stored before; nothing new stored")

// NoReplyError is returned by Call when its context ended before the job's
// outcome came. It wraps ErrNoReply and the context's error.
type NoReplyError struct {
	JobID string
	Err   error
}

func (e *NoReplyError) Error() string {
	return fmt.Sprintf("%v (job %s): %v", ErrNoReply, e.JobID, e.Err)
}

func (e *NoReplyError) Unwrap() []error { return []error{ErrNoReply, e.Err} }

// ErrPermanent marks an error that retrying cannot fix: the job goes to the
// dead-letter stream at once.
var ErrPermanent = errors.New("keylane: permanent error")

// ErrUnknownType is returned (permanently) by a Mux for a job type it has no
// handler for.
var ErrUnknownType = errors.New("keylane: unknown job type")

// Permanent wraps err so that errors.Is(err, ErrPermanent) holds.
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

// RemoteError is a handler's error as a caller of Call receives it.
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

// ErrNoResult is returned by Client.Result when no result is stored for the
// job (it has not finished, results are not stored, or the result expired).
var ErrNoResult = errors.New("keylane: no stored result")

// ErrStaleFence is returned by State.Apply when the key was last written
// under a newer fence than the job's: a newer owner of the partition exists,
// so this worker must not write, reply or ack.
var ErrStaleFence = errors.New("keylane: stale fence: a newer owner has written this key")

// ErrBadState is returned when a state entry cannot be decoded.
var ErrBadState = errors.New("keylane: malformed state entry")

// ErrGap is returned when a job's stream sequence is at or below the one
// its key's state was written with, but the entry does not hold that job's
// outcome: the job never ran, and later jobs of its key did (a delivery
// that never reached the worker, or a restored stream).
var ErrGap = errors.New("keylane: gap: a later job of this key was applied, this one never was")

// ErrEpoch is returned when a key's state was written under another jobs
// stream than the namespace's current one (the stream was deleted and
// created again): its sequences say nothing about the new stream's. Adopt
// the old epoch explicitly (Adopt, `keylane adopt`) to carry the state on.
var ErrEpoch = errors.New("keylane: state written under another jobs stream (re-created?); adopt its epoch to carry the state over")

// ErrPartitionMismatch is returned when the jobs stream was created with a
// different partition count or hash than the caller expects. Jobs routed with
// another N would land on the wrong partition and break per-key exclusion, so
// keylane refuses to run rather than guess.
var ErrPartitionMismatch = errors.New("keylane: partition count or hash differs from the jobs stream")

// ErrNoTopology is returned when a client opens a namespace whose jobs
// stream does not exist yet. Clients never create one (ClientConfig's
// Partitions only checks the count); a worker, or Setup, does.
var ErrNoTopology = errors.New("keylane: no jobs stream for the namespace: start a worker (it creates the namespace), or call Setup")

// noTopologyError is ErrNoTopology naming the namespace.
type noTopologyError struct{ namespace string }

func (e *noTopologyError) Error() string {
	return fmt.Sprintf("keylane: no jobs stream for namespace %q: start a worker (it creates the namespace), or call Setup", e.namespace)
}

func (e *noTopologyError) Unwrap() error { return ErrNoTopology }

// ErrReplicasMismatch is returned when an object of the namespace exists
// with another replica count than configured: consumers and buckets of
// mixed replica counts fail in ways that look like anything but this.
var ErrReplicasMismatch = errors.New("keylane: replica count differs from the namespace's")

// ErrShardsMismatch is returned when the namespace's jobs streams were
// created with another shard count than the caller configured, or their
// shard metadata disagree. Nothing is changed: the shard count, like the
// partition count, is fixed when the namespace is created.
var ErrShardsMismatch = errors.New("keylane: stream shard count differs from the namespace's")

// ErrReplyPrefixMismatch is returned when a worker is configured with
// another reply prefix than the one its namespace was created with: the
// clients take their inboxes under the namespace's, so replies sent under
// another would reach no one (or someone else).
var ErrReplyPrefixMismatch = errors.New("keylane: reply prefix differs from the namespace's")

// ErrMaxDeliverMismatch is returned when a worker is configured with
// another MaxDeliver than its namespace's (fixed by the first worker): a
// job's attempts are counted across owners, so workers that disagree
// would dead-letter the same job after different counts, depending on
// which one owns its partition.
var ErrMaxDeliverMismatch = errors.New("keylane: MaxDeliver differs from the namespace's")

// ErrNotStarted is returned by a worker's State before the worker started
// (Worker.State).
var ErrNotStarted = errors.New("keylane: the worker has not started: its State works once Start has set the namespace up")

// ErrPayloadDropped is returned by Redrive for a dead letter whose payload
// was dropped to fit: there is nothing to run again.
var ErrPayloadDropped = errors.New("keylane: the dead letter's payload was dropped (too large); it cannot be redriven")

// ErrMalformedBatch is returned by Redrive (and DeadLetter.RedriveJobs)
// for a batch message dead-lettered whole whose body does not decode
// (wire.DecodeBatch): it holds no job to submit again. The dead letter is
// left in place.
var ErrMalformedBatch = errors.New("keylane: this dead letter is a malformed batch: nothing to redrive")

// ErrStateUnavailable is wrapped by every error of a state bucket read or
// write that failed or whose outcome is unknown: no leader, a lost
// connection, a full store. It is never the job's fault: the worker tries
// the job again with backoff for as long as its lease is trusted, without
// spending one of its MaxDeliver attempts, and the next try re-reads the
// entry, which tells whether a write of unknown outcome landed. A Handler
// that uses State should return such an error unchanged (or wrapped).
var ErrStateUnavailable = errors.New("keylane: state bucket unavailable")

// ErrUnavailable marks a GroupApplier's error of a whole call that says
// its database is not there to answer (a connection refused or broken, a
// server starting or shutting down, the call's deadline): not the jobs'
// fault, so the worker tries the job again for as long as that lasts and
// never counts such a failure against it (see GroupApplier). keylanepg
// marks its errors so.
var ErrUnavailable = errors.New("keylane: the applier's database is unavailable")

// ErrStateTooLarge is returned (permanently: the job is dead-lettered
// with it) when a key's next state entry cannot fit in one message even
// with its held window shrunk to the outcomes of the jobs being written:
// the value and the job's result are too large for the server's
// max_payload. Nothing was written; the key moves on to its next job.
var ErrStateTooLarge = errors.New("keylane: state entry larger than the server's max_payload allows")

// stateError is a state bucket read or write that did not go through.
type stateError struct {
	key string
	err error
}

func (e *stateError) Error() string { return fmt.Sprintf("keylane: state %q: %v", e.key, e.err) }

func (e *stateError) Unwrap() []error { return []error{ErrStateUnavailable, e.err} }
