package keylane

import "github.com/keylane/keylane/internal/core"

// The errors keylane returns, in one place (defined in internal/core, which
// the engine's rooms share).
var (
	// ErrPayloadTooLarge is returned for a job larger than the server's
	// max_payload; nothing is sent.
	ErrPayloadTooLarge = core.ErrPayloadTooLarge
	// ErrBadJobID is returned for a job ID keylane cannot carry.
	ErrBadJobID = core.ErrBadJobID
	// ErrBadType is returned for a job type keylane cannot carry (see
	// package wire); nothing is stored.
	ErrBadType = core.ErrBadType
	// ErrReservedHeader is returned for a header of WithHeader or
	// Request.Headers under Nats-* or Keylane-* (any case), or named Status
	// or Description; nothing is stored.
	ErrReservedHeader = core.ErrReservedHeader
	// ErrBadHeader is returned for a header name nats.go cannot send, or a
	// value that would not arrive as sent; nothing is stored.
	ErrBadHeader = core.ErrBadHeader
	// ErrNoReply is returned (as a *NoReplyError naming the job) by Call
	// when ctx ended before the job's outcome came. Call does not wait for
	// the stream's ack before the outcome, so the job may or may not have
	// been stored: call again with the same WithID to get its outcome
	// without running it twice.
	ErrNoReply = core.ErrNoReply
	// ErrClosed is returned by calls made after Close, and by Calls (and
	// Submits retrying a publish) that were still waiting when it ran.
	ErrClosed = core.ErrClosed
	// ErrDuplicate is returned by Submit (with the job's ID) when the stream
	// already stored a job with this ID and said so: nothing new was stored.
	// Only a job that goes as a one-job message can get it (a delayed job, a
	// redrive, a job on a namespace with a key backlog cap). A job in a batch
	// message (every other) with a caller's ID that ran before is stored
	// again and answered by the worker from its kept outcome, never run
	// twice: Submit returns nil for it.
	ErrDuplicate = core.ErrDuplicate
	// ErrPermanent marks an error that retrying cannot fix: the job goes to the
	// dead-letter stream at once.
	ErrPermanent = core.ErrPermanent
	// ErrUnknownType is returned (permanently) by a Mux for a job type it has no
	// handler for.
	ErrUnknownType = core.ErrUnknownType
	// ErrNoResult is returned by Client.Result when no result is stored for the
	// job (it has not finished, results are not stored, or the result expired),
	// or, on a replicated namespace, when the replica that answered has not
	// yet applied an outcome kept a moment ago (Client.Result): never proof
	// that the job did not run.
	ErrNoResult = core.ErrNoResult
	// ErrStaleFence is returned by State.Apply when the key was last written
	// under a newer fence than the job's: a newer owner of the partition exists,
	// so this worker must not write, reply or ack.
	ErrStaleFence = core.ErrStaleFence
	// ErrBadState is returned when a state entry cannot be decoded.
	ErrBadState = core.ErrBadState
	// ErrGap is returned when a job's stream sequence is at or below the one
	// its key's state was written with, but the entry does not hold that job's
	// outcome: the job never ran, and later jobs of its key did (a delivery
	// that never reached the worker, or a restored stream).
	ErrGap = core.ErrGap
	// ErrEpoch is returned when a key's state was written under another jobs
	// stream than the namespace's current one (the stream was deleted and
	// created again): its sequences say nothing about the new stream's. Adopt
	// the old epoch explicitly (Adopt, `keylane adopt`) to carry the state on.
	ErrEpoch = core.ErrEpoch
	// ErrPartitionMismatch is returned when the jobs stream was created with a
	// different partition count or hash than the caller expects. Jobs routed with
	// another N would land on the wrong partition and break per-key exclusion, so
	// keylane refuses to run rather than guess.
	ErrPartitionMismatch = core.ErrPartitionMismatch
	// ErrNoTopology is returned when a client opens a namespace whose jobs
	// stream does not exist yet. Clients never create one (ClientConfig's
	// Partitions only checks the count); a worker, or Setup, does.
	ErrNoTopology = core.ErrNoTopology
	// ErrReplicasMismatch is returned when an object of the namespace exists
	// with another replica count than configured: consumers and buckets of
	// mixed replica counts fail in ways that look like anything but this.
	ErrReplicasMismatch = core.ErrReplicasMismatch
	// ErrShardsMismatch is returned when the namespace's jobs streams were
	// created with another shard count than the caller configured, or their
	// shard metadata disagree. Nothing is changed: the shard count, like the
	// partition count, is fixed when the namespace is created.
	ErrShardsMismatch = core.ErrShardsMismatch
	// ErrReplyPrefixMismatch is returned when a worker is configured with
	// another reply prefix than the one its namespace was created with: the
	// clients take their inboxes under the namespace's, so replies sent under
	// another would reach no one (or someone else).
	ErrReplyPrefixMismatch = core.ErrReplyPrefixMismatch
	// ErrMaxDeliverMismatch is returned when a worker is configured with
	// another MaxDeliver than its namespace's (fixed by the first worker): a
	// job's attempts are counted across owners, so workers that disagree
	// would dead-letter the same job after different counts, depending on
	// which one owns its partition.
	ErrMaxDeliverMismatch = core.ErrMaxDeliverMismatch
	// ErrNotStarted is returned by a worker's State before the worker started
	// (Worker.State).
	ErrNotStarted = core.ErrNotStarted
	// ErrPayloadDropped is returned by Redrive for a dead letter whose payload
	// was dropped to fit: there is nothing to run again.
	ErrPayloadDropped = core.ErrPayloadDropped
	// ErrMalformedBatch is returned by Redrive (and DeadLetter.RedriveJobs)
	// for a batch message dead-lettered whole whose body does not decode
	// (wire.DecodeBatch): it holds no job to submit again. The dead letter is
	// left in place.
	ErrMalformedBatch = core.ErrMalformedBatch
	// ErrStateUnavailable is wrapped by every error of a state bucket read or
	// write that failed or whose outcome is unknown: no leader, a lost
	// connection, a full store. It is never the job's fault: the worker tries
	// the job again with backoff for as long as its lease is trusted, without
	// spending one of its MaxDeliver attempts, and the next try re-reads the
	// entry, which tells whether a write of unknown outcome landed. A Handler
	// that uses State should return such an error unchanged (or wrapped).
	ErrStateUnavailable = core.ErrStateUnavailable
	// ErrUnavailable marks a GroupApplier's error of a whole call that says
	// its database is not there to answer (a connection refused or broken, a
	// server starting or shutting down, the call's deadline): not the jobs'
	// fault, so the worker tries the job again for as long as that lasts and
	// never counts such a failure against it (see GroupApplier). keylanepg
	// marks its errors so.
	ErrUnavailable = core.ErrUnavailable
	// ErrStateTooLarge is returned (permanently: the job is dead-lettered
	// with it) when a key's next state entry cannot fit in one message even
	// with its held window shrunk to the outcomes of the jobs being written:
	// the value and the job's result are too large for the server's
	// max_payload. Nothing was written; the key moves on to its next job.
	ErrStateTooLarge = core.ErrStateTooLarge
	// ErrKeyBacklogFull is returned (as a *KeyBacklogFullError naming the key
	// and the cap) by Submit, Call, SubmitMany and Redrive when the key already
	// has TopologyConfig.MaxKeyBacklog jobs stored and not finished: the job
	// was refused and nothing was stored. It is not retried; a shop answers it
	// with "sold out / try again later". Other keys are not affected.
	ErrKeyBacklogFull = core.ErrKeyBacklogFull
	// ErrOldJobsStream is returned when the namespace's jobs stream was made by
	// an older keylane: before per-key subjects (one subject per partition,
	// keylane.version below 3), or before every job travelled in a batch
	// message (keylane.version 3: it may hold one-job messages, which today's
	// workers refuse). Its jobs are in a form today's workers do not run, so
	// it is refused rather than half used. Drain it with the keylane that
	// made it, then delete it (nats stream rm) or use another namespace.
	ErrOldJobsStream = core.ErrOldJobsStream
	// ErrKeyBacklogMismatch is returned when the jobs stream's per-key backlog
	// cap differs from a non-zero TopologyConfig.MaxKeyBacklog. keylane never
	// changes a stream's cap: the server would delete the oldest stored jobs
	// of every key over a lowered or new cap, paid orders among them.
	ErrKeyBacklogMismatch = core.ErrKeyBacklogMismatch
	// ErrBadDelay is returned for a negative delay, a run-at time further
	// in the past than RunAtTolerance, or one beyond MaxDelay: nothing is
	// stored.
	ErrBadDelay = core.ErrBadDelay
	// ErrDelaysOff is returned for a delayed job (and by Setup when
	// TopologyConfig.Delays is asked of a namespace made without) when
	// the namespace was not created with Delays: nothing is stored.
	ErrDelaysOff = core.ErrDelaysOff
	// ErrDelayedCall is returned by Call with WithDelay or WithRunAt:
	// Call waits for a result, a delayed job has none until it ran.
	// Submit it, and fetch its outcome with Result (submit it WithID, so
	// it is kept by ID).
	ErrDelayedCall = core.ErrDelayedCall
	// ErrHeld is returned (as a *HeldError naming the job) by Call when the
	// worker holds the job, stored, without running it until an operator acts:
	// today a key whose state was written under another jobs stream (the
	// stream was re-created; errors.Is ErrEpoch too), which runs once the old
	// epoch is adopted (AdoptEpoch, keylane adopt). The job is neither failed
	// nor lost: call again with the same WithID to get its outcome once it
	// ran. A HeldError is also errors.Is ErrNoReply, whose advice it shares.
	ErrHeld = core.ErrHeld
	// ErrNoState is returned by InspectState for a key whose state entry does
	// not exist: never written by a Reducer, or deleted.
	ErrNoState = core.ErrNoState
	// ErrNamespaceInUse is returned by DeleteNamespace when a worker holds a
	// live lease on one of the namespace's partitions.
	ErrNamespaceInUse = core.ErrNamespaceInUse
	// ErrRecordRetention is Start's error when the Applier's RecordRetention
	// is shorter than a job can come back (MinRecordRetention).
	ErrRecordRetention = core.ErrRecordRetention
)

// NoReplyError is returned by Call when its context ended before the job's
// outcome came. It wraps ErrNoReply and the context's error.
type NoReplyError = core.NoReplyError

// Permanent wraps err so that errors.Is(err, ErrPermanent) holds.
func Permanent(err error) error { return core.Permanent(err) }

// RemoteError is a handler's error as a caller of Call receives it.
type RemoteError = core.RemoteError

// HeldError is ErrHeld for one job: JobID, the held job's ID (call again
// with it for its outcome), and Reason, the worker's (why the job is held
// and what releases it). One held for ErrEpoch is errors.Is ErrEpoch too.
type HeldError = core.HeldError
