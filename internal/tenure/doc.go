// Package tenure runs one partition for as long as a worker holds its
// lease: a tenure. It re-creates the partition's consumer, fetches its
// batch messages, hands each job to its key's lane (internal/lanes), runs
// it through the worker's Handler, Reducer or Applier with retries, keeps
// its outcome, replies, acks, dead-letters, hands jobs back, moves delayed
// jobs into the delays stream, and ends the tenure on hand-over, abort or
// lease loss.
//
// Its main type is Owner, built by New from a Config that names everything
// the tenure uses: the partition, its lease, the worker's logger, the
// connection and JetStream context, the namespace's Topology
// (internal/namespace), exactly one of Handler, Reducer and Applier (the
// interfaces are internal/core's, aliased by package keylane), the
// WorkerObserver, the retry backoff and limits (MaxDeliver, AckWait,
// MaxPending, MaxInFlight, Concurrency, StoreResults, the lease TTL), the
// state store (internal/statestore) a Reducer commits through, the kept
// outcomes' shared memory and batch size (internal/kept), the tracing
// (internal/tracing), the counters it shares with the worker's other
// tenures (*Stats, owned by the Worker, which reads them for
// Worker.Stats), and two callbacks of the Worker: RequestReload (the jobs
// stream is of another epoch: a repartition) and RefreshEpoch (a key held
// for ErrEpoch). An Owner is the worker's balance.Owner (Run, HandOver,
// Abort, Done); Lease, Backlog and InFlight answer Worker.Tenures. The
// package imports neither the root nor internal/balance: its imports run
// down to internal/kept, internal/statestore, internal/namespace,
// internal/lanes, internal/tracing, internal/core, wire, partition and
// lease. Package keylane fills the Config (balancehooks.go:
// Worker.tenureConfig).
//
// Files, one role each:
//
//	owner.go          Config, Stats, Owner, New; the tenure's life (run),
//	                  hand-back, hand-over's wait for its acks (settle),
//	                  release
//	consumer.go       the consumer re-created on each acquire and re-sync,
//	                  retried while an election may cure it
//	fetch.go          the pull loop, gap and reconnect detection, dispatch
//	                  of batch messages and due copies, the door's refusals
//	                  (malformed, one-job messages)
//	task.go           a fetched job as a lanes.Task, and the lanes
//	execute.go        process: handler runs, retries with backoff, the
//	                  restart counter, groups of a Reducer
//	reducer.go        a Reducer's group commit and its CommitObserver
//	applier.go        an Applier's groups, joined across keys into one
//	                  transaction
//	complete.go       finish (keep, reply, ack), dead letters, look-ups of
//	                  kept outcomes, replays
//	kept.go           the owner's side of internal/kept
//	batchpart.go      a job of a batch message: its Ack settles the job,
//	                  the last settles the message
//	batchoutcomes.go  Calls' outcomes kept per batch, the batch ID's entry
//	                  bound to its message
//	backlog.go        Tenure.Backlog: batch messages ahead counted as jobs
//	delaymove.go      a delayed job's submission moved into the delays
//	                  stream; due copies deleted
//	undeliverable.go  messages nats.go swallows as a status, removed
//	replies.go        grouped replies (one message per client inbox)
//	held.go           the notice to a Call whose job is held (ErrEpoch)
//	redrive.go        a redrive ticket read before an outcome is kept
//	                  under the dead letter's ID too
//	outcome.go        the outcome codec and reply message
//	observe.go        the WorkerObserver's measuring sites
//	tracehooks.go     the worker's spans (internal/tracing), nil checks
//	                  when off
//	joblog.go         the per-job events at DEBUG
//	testhooks.go      what package keylane's tests reach for
//
// Failure cases it handles, and the test (in package keylane unless
// named) that shows each; jetstream/doc.go writes down the reasoning:
//
//   - A previous owner's unacked jobs: the consumer is deleted and
//     re-created on acquire, so they come again at once, in order; the
//     sequences any earlier consumer delivered are possible redeliveries,
//     looked up by ID before they run. TestBatchRedeliveredAfterCrashBetweenApplyAndAck,
//     TestResultsBucketAnswersMissedResults.
//   - A consumer that cannot be created (an election, a slow meta
//     leader): retried with backoff, each attempt bounded, the bound
//     growing after an election's time. TestOwnerCreatesItsConsumerThroughASlowMetaLeader.
//   - A jobs stream of another epoch (a repartition): never consumed; the
//     worker is asked to reload (Config.RequestReload).
//     TestRepartitionKeepsEveryKeysState.
//   - A delivery gap (a stray puller, a message lost with a connection or
//     leader), a reconnect, missed heartbeats: nothing after the gap runs;
//     the partition re-synchronises from its ack floor, spaced by backoff.
//     TestStrayPullerLosesNoJob (and e2e's), TestMissedHeartbeatsStillResync,
//     TestSmallWindowKeepsPulling, e2e TestWorkerConnectionCutMidDelivery.
//   - A message nats.go swallows as a status (an empty payload with a
//     Status header, from a raw publisher): dead-lettered and deleted, with
//     no re-sync when it explains the gap. TestStatusLookalikeDoesNotStallThePartition,
//     TestSwallowedHeartbeatLookalikeNeedsNoResync.
//   - Deliveries that never arrived and no later one to show the gap (a
//     swallowed message that is the partition's last job, redelivered and
//     swallowed each AckWait): an idle partition compares what its
//     consumer delivered with what it received, and re-synchronises,
//     removing such messages first. TestTrailingStatusLookalikeIsRemoved.
//   - Bad input on the wire (no valid job, a key of another partition, an
//     injected reply subject, a one-job message, a malformed batch): dead-
//     lettered with the reason, acked, its caller on a valid reply subject
//     told; the handler never sees it. TestMalformedMessagesAreDeadLettered,
//     TestInjectedReplySubjectIsDeadLettered, TestNonPartitionSubjectsAreRefused,
//     TestOneJobMessageIsRefused, TestStaleClientPartitionCountIsRefused, e2e TestBadInput,
//     e2e TestHostileWire.
//   - A failing job: retried in place with backoff, later jobs of its key
//     behind it, other keys flowing (its key's queued jobs handed back);
//     dead-lettered after MaxDeliver attempts or at once when Permanent.
//     TestRetriesInPlaceKeepKeyOrder, TestFailuresAreDeadLetteredAndOtherKeysFlow,
//     TestFailingKeyDoesNotStallItsPartition, TestFailingKeyDoesNotHoldASmallWindow,
//     TestStalledKeysDoNotFillTheWindow, TestHotKeyLeavesHandBackMode, e2e TestPoisonJob.
//   - A job that crashes every worker that runs it: its starts are counted
//     across owners, and it is dead-lettered past MaxDeliver.
//     e2e TestCrashLoopJob, TestRestartCountersLeaveNothingInTheStateBucket.
//   - A state bucket or database that does not answer (ErrStateUnavailable,
//     a failed transaction): not the job's fault; tried again with backoff
//     while the lease is trusted, never dead-lettered on a guess; an
//     Applier's refusal for good holds the job, said at ERROR; a contract
//     broken is said for good. TestStateOutageIsNotTheJobsFault,
//     TestApplierRefusingForGoodHoldsTheJob, TestApplierBreakingItsContractIsSaidForGood,
//     keylanepg's TestCommittedJobIsNotDeadLettered and TestWholeGroupFailureEnds.
//   - A newer owner wrote the key (ErrStaleFence): the tenure steps down at
//     once. TestStaleOwnerWriteIsFenced, keylanepg's TestPausedWorkerRefusedByFence.
//   - A job skipped by a later job of its key (ErrGap): dead-lettered,
//     loudly, counted (Stats.Gaps), never applied.
//     TestGapThroughAWorkerIsDeadLettered; the state's side,
//     TestStateAppliesJobsOfOneBatchInOrder.
//   - A key's state written under another jobs stream (ErrEpoch): the job
//     is held until its epoch is adopted, its Call told at once.
//     TestRecreatedJobsStreamIsRefusedUntilAdopted, TestCallOnARecreatedStreamSaysHeld.
//   - Lease loss: handlers' contexts cancelled, nothing more replied or
//     acked; the next owner runs the jobs again. TestLeaseLossCancelsHandlersAndSkipsAck,
//     TestNoJobRunsTwiceWithALaggingFollower.
//   - A hand-over: the owner finishes what it fetched and waits until the
//     server applied its acks, so the successor runs none of them again.
//     TestHandOverWaitsForItsAcks, TestStopDeadlineCancelsTheDrain, e2e TestGracefulStop.
//   - A retry by ID, or a redelivery, of a job that finished: answered
//     from its kept outcome (by ID, or in its batch's entry), never run
//     again; a kept outcome that cannot be read dead-letters the job
//     instead of running it. TestRetriedCallGetsTheOutcome, TestRetryByIDInABatchRunsOnce,
//     TestGroupLooksUpKeptOutcomesAtOnce, TestBatchedMissFromALaggingReplicaGoesToTheLeader,
//     TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain, TestGarbledBatchEntryNeverRunsTheJobAgain,
//     TestDeadLetteredJobOfABatchNeverRunsAgain.
//   - Outcomes that cannot be kept for the moment: tried again with backoff
//     while the lease is trusted, nothing replied or acked before; a batch
//     entry over max_payload is kept by job ID. TestBatchEntryOverMaxPayloadIsKeptByID,
//     TestBatchRedeliveredBeforeItsOutcomesWereKept.
//   - A batch ID whose entry is another message's (a forged ID): refused
//     whole, never overwriting the entry. Its entry is read on receipt,
//     off the fetch loop (claimBatchID); none of the batch's jobs runs
//     until the read answered (gateClaims), and a refused batch's jobs are
//     settled unrun once it is dead-lettered. A message of an ID whose
//     read is still out waits for it before its own claim is decided, so
//     a forgery just ahead of an honest copy does not get the copy
//     refused; a batch with a malformed job waits for its claim before
//     dead-lettering that job, so a refused one is dead-lettered whole
//     (job 0's dead letter would take the batch's ID). TestForgedBatchIDNeverOverwritesItsEntry,
//     TestDeadLetterOfAForgedIDTakesNoOthersPlace, TestForgeryAheadLeavesTheHonestCopyItsEntry,
//     TestForgedBatchWithAMalformedJobIsDeadLetteredWhole.
//   - A dead letter the stream refuses (too large, a header it does not
//     take) or cannot take (no leader): sent bare, or retried with backoff,
//     the lane held until it is stored. TestDeadLetterTooLargeStillFits,
//     TestDeadLetterUnwritableHoldsTheLane.
//   - A redrive hint (Keylane-Redrive-Of) without its operator's ticket:
//     ignored; with it, the outcome is kept under both IDs.
//     TestDeadLettersRedriveAndPurge, TestRedriveKeepsBothIDsInOneBatch.
//   - A delayed job's submission: moved into the delays stream once (one
//     schedule per job ID), refused ones dead-lettered, a failed move
//     delivered again. TestDelayedJobRunsAtItsTimeInKeyOrder,
//     TestDelayedJobSurvivesWorkerRestart, TestForgedDelayedIDIsRefused.
//   - A long job: kept from redelivery by InProgress every AckWait/3.
//     TestLongJobIsKeptAliveWithInProgress.
//   - Replies of a hot key's group: one message per client inbox, split
//     at max_payload. TestGroupedRepliesHotKeyOneClient, TestGroupedRepliesSplitAtMaxPayload,
//     TestGroupedInboxTakesOnlyDecodableTokens (here).
//   - Measuring, tracing and DEBUG events cost nothing when off.
//     TestNoObserverCostsNothing, TestTracingOffAllocatesNothing, TestJobLogFreeAtInfo (all here).
package tenure
