// Package client is the engine of keylane.Client: it turns a job into a
// message, batches the messages of a partition, publishes them, and waits
// for their stream acks and, for a Call, for the worker's reply.
//
// Its one type is Client, built by New from a Config. The Config names
// every fact of the namespace the client needs (partition count, the jobs
// streams by shard, the reply prefix, the key backlog cap, whether delays
// are on, the JetStream API prefix, the room a dead letter needs, and
// CheckStream, which tells a stream repartitioned since). The root
// (package keylane) opens the namespace, fills the Config in, and wraps
// Client with the API: the options, the Observer's measurements, Redrive
// and Backlog. The package imports neither the root nor the namespace
// code; its own imports run down: internal/batcher, internal/tracing,
// internal/core, internal/natserr, wire and partition.
//
// Files, one role each:
//
//	client.go     Config, Client, New, Close; message: a request checked by
//	              the worker's rules (package wire) into a job message
//	submit.go     Submit, SubmitMany, publish (retried while a reconnect or
//	              an election may cure it)
//	call.go       Call, the waiters, a lost reply recovered from the kept
//	              outcome (awaitOutcome)
//	replies.go    what comes to the inbox: acks, single and grouped replies,
//	              held notices
//	wirebatch.go  the one wire path: every job in a batch message, cut by
//	              the partition's batcher (or SubmitMany's), sealed with an
//	              unguessable batch ID
//	admission.go  a job refused over its key's cap: full, or a retry of a
//	              job applied or still queued
//	refused.go    acks awaited while watching for the server's refusal
//	delay.go      a delayed job's submission
//	result.go     Result: an outcome by job ID, or in its batch's entry
//	randid.go     IDs from crypto/rand
//	testhooks.go  what the root's tests look at
//
// Failure cases it handles, and the test (in package keylane unless named)
// that shows each:
//
//   - A publish, or its ack, lost with a connection or a leader: the job
//     (or its batch, whole, under the batch's ID) is published again; the
//     server drops a copy it has, and a later copy is marked for the
//     worker to look its ID up. TestSubmitRepublishesALostPublish,
//     TestCallRepublishesALostPublish, TestSubmitWhoseAckWasLostIsNoDuplicate,
//     TestBatchedCallWhoseBatchAckIsLost.
//   - A reply lost on the way (a reconnect, a worker whose lease was
//     failing): the Call reads the outcome the worker kept, by ID or in its
//     batch's entry. TestCallRecoversALostReply,
//     TestBatchedCallRecoversALostReply, TestRetriedCallGetsTheOutcome.
//   - A publish the server refuses (permissions): the call ends at once
//     with the refusal, not at its deadline. TestRefusedPublishFailsFast
//     (docs/security).
//   - SubmitMany whose context ends: a job whose ack was not seen is never
//     reported stored. TestSubmitManyNeverClaimsUnknownJobs.
//   - A batch ID someone else used first (predicted or not): the batch is
//     reported not stored, never as stored. TestPredictedBatchIDsLoseNoJobs,
//     TestBatchUnderAUsedIDIsNotStored.
//   - A batch over max_payload or the wire's own limit: cut before.
//     TestBatchesCutByMaxPayload, TestBatchesCutByTheWireLimit.
//   - A key at its backlog cap: KeyBacklogFullError, unless the job is a
//     retry of one applied (its outcome) or still queued (ErrDuplicate, or
//     the Call waits for it); "unknown" when that cannot be read.
//     TestKeyBacklogCapRefusesBeyondN, TestKeyBacklogRetryOfAnAppliedJobGetsItsOutcome,
//     TestKeyBacklogRetryOfAQueuedJobIsNotFull, TestKeyBacklogCapHoldsForBatches.
//   - A client opened before a repartition: its jobs are refused with
//     ErrPartitionMismatch, not retried forever. TestStaleClientPartitionCountIsRefused,
//     TestStaleClientSubmitToAGonePartition, TestStaleBatchingClientCallsEndPromptly.
//   - A job held by the worker (a re-created jobs stream): the Call ends with
//     a HeldError at once. TestCallOnARecreatedStreamSaysHeld.
//   - A grouped reply that does not decode: dropped whole, its Calls
//     recover their outcomes. TestMalformedGroupedReplyIsDropped.
//   - A reply whose error header is empty: still an error.
//     FuzzDecodeReply (here).
//   - Bad input (key, ID, type, headers, delay, size): refused before
//     anything is sent. TestValidateJobID, TestDelayBadInputStoresNothing.
//   - Close with Calls waiting: each ends with ErrClosed at once.
//     TestCloseFailsWaitingCalls.
package client
