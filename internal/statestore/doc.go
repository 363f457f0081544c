// Package statestore is keylane's per-key state: one entry a resource key
// in the namespace's state bucket (a KV bucket), written with
// compare-and-set, that holds the key's value, the fence, stream sequence,
// batch index and jobs stream epoch of the last job applied to it, and the
// outcomes (job ID and result) of the key's recent jobs. The root's State
// (Topology.NewState, Worker.State, a Handler's State.Apply) is its API;
// a partition's tenure commits its Reducer jobs through it.
//
// Its main type is Store, built by New from a Config: the state bucket
// (KV), the epoch of the jobs stream shard that holds a partition
// (EpochOf), the epochs adopted from earlier streams (Adopted), the
// connection whose server's max_payload bounds an entry (Conn), and how
// many outcomes an entry holds (Keep, HeldJobs by default). Bind points a
// Store at another bucket and epochs (a worker's Start, a repartition that
// replaced the jobs streams) and forgets its cache. It imports core, wire
// and the NATS helpers below them, never the root.
//
// What it does, by file:
//
//   - store.go: Store.Apply (one job, a compare-and-set loop) and Get, and
//     the check every job passes against the key's entry before it runs.
//   - group.go: the group commit (Store.Group): a tenure reads a key once,
//     applies a group of its jobs in stream order, and stores the outcome
//     with one compare-and-set, caching the entry for the next group. A
//     group stops growing after 5ms of reducers or 64 KiB of results.
//   - codec.go: the entry's encoding (version 4/5: outcomes as deltas and
//     shared ID prefixes; versions 1 to 3 are still read) and Key, the
//     bucket key of a resource key.
//   - heldlog.go: the held window kept between group commits, so a group
//     costs what it holds, not what the window does; its bytes are the
//     codec's, byte for byte.
//   - fit.go: an entry must fit in one message: its window shrinks to fit
//     the server's max_payload.
//   - batch.go: the writes of a partition's concurrent groups coalesced
//     into one JetStream atomic batch (WorkerConfig.StateBatch, off by
//     default), through internal/jsbatch.
//   - cas.go: Put, Conflict and Loop, the one compare-and-set writer of
//     keylane's KV entries (the root's crash-loop counter uses it too).
//
// Failure cases it handles, and the test that shows each (jetstream/doc.go,
// "Outcomes are held" and "Refusals", tells the whole story):
//
//   - A redelivered job, or the same job ID submitted again after the
//     server's duplicate window, is answered with its held result and
//     writes nothing: TestStateAppliesExactlyOnce,
//     TestStateHoldsOutcomesOfEarlierWrites,
//     TestStateSameJobIDAfterDuplicateWindowAppliesOnce; a full window read
//     back by a new owner answers every held job and no more:
//     TestStateFullWindowSurvivesTheBucket.
//   - A job at or below the key's applied (sequence, index) whose outcome
//     is not held never ran while later jobs did: ErrGap, nothing written,
//     never an empty success: TestStateSeqBelowStoredIsNotAppliedWithoutItsOutcome
//     (Apply and Group).
//   - A job whose fence is below the stored one comes from a stale owner:
//     ErrStaleFence, nothing written: TestStateRefusesStaleFence.
//   - An entry written under another jobs stream (re-created) is refused
//     with ErrEpoch until the namespace adopts that epoch (Adopt); then
//     only job IDs compare: the root's
//     TestRecreatedJobsStreamIsRefusedUntilAdopted and
//     TestRecreatedShardIsRefusedUntilAdopted.
//   - Concurrent writers: a lost compare-and-set re-reads and decides
//     again, at most nine times (ErrTooManyWriters):
//     TestStateConcurrentWritersSerialise,
//     TestHeldLogSharedStateConcurrentApply; a write that lost, or whose
//     outcome is unknown, drops the cache and the next one re-reads:
//     TestHeldLogRebuiltAfterLostWrite, TestHeldLogRebuiltAfterReread.
//   - A write refused for a cause a retry cannot cure (over max_payload,
//     an invalid key) is permanent, the job's to be dead-lettered; any
//     other failed read or write is a core.StateError (ErrStateUnavailable),
//     an outage and not the job's fault: the root's
//     TestStateOutageIsNotTheJobsFault.
//   - An entry over max_payload sheds its oldest held outcomes, never the
//     group's own; one that cannot fit with only those is ErrStateTooLarge,
//     permanent: TestFitShrinksTheOldestOutcomes, the root's
//     TestStateEntryOverMaxPayload.
//   - A damaged entry (a cut, a count beyond its bytes) is ErrBadState,
//     never a shorter window read as valid: TestStateCodecRefusesDamagedEntries;
//     earlier versions are still read: TestStateCodecReadsEarlierVersions.
//   - The held log writes what the full path writes, byte for byte, for any
//     sequence of groups: TestHeldLogMatchesFullPath (seeded;
//     HELDLOG_SEED repeats a run), TestHeldLogComparisonCatchesOneOutcome.
//   - A refusal reads "nats:" once and still matches the conflict
//     sentinels: TestCasPutSaysNatsOnce.
//   - A coalesced batch the server refuses stored nothing: its writes go
//     again alone, so a conflict is one key's, not its neighbours':
//     TestStateBatchConflictIsOneKeys; a write whose batcher closed under
//     it goes alone over its own revision: TestStateWriteWhenBatchesCloseUnderIt;
//     the batch's revisions are those stored: the root's
//     TestStateWritesOfSeveralKeysGoAsOneBatch and
//     TestStateWritesBatchedOnACluster.
//   - A worker's State before its Start is ErrNotStarted: the root's
//     TestWorkerStateBeforeStart.
package statestore
