// Package kept keeps and finds job outcomes in the results bucket: a
// partition tenure's look-ups by job ID, its outcome puts as one atomic
// batch, and the entries that keep a batch message's Calls' outcomes
// together. jetstream/doc.go ("Retries by job ID", "Reads that decide",
// "Kept outcomes in one batch", "Batches on the wire") writes down the
// protocol; this package is its code.
//
// Its main type is Store, one per partition tenure (the owner builds it
// when the tenure begins), made by New from a Config: the worker's
// connection and JetStream context, the results bucket's name, the fewest
// puts that go as one batch (WorkerConfig.OutcomeBatch resolved), the
// tenure's logger, and the worker's Memory, shared by its tenures, of what
// the server refused (the batched look-up, atomic batches). The Store
// never sees the owner or the Worker: what is the tenure's (its tasks,
// open batches, dead letters, the lease's trust) stays with the caller,
// which hands the Store job IDs, puts and batch IDs and gets outcomes,
// revisions and errors back. It imports only internal/core, internal/natserr
// and wire of keylane.
//
// # Look-ups by job ID
//
// Store.LookUp asks for a group's IDs in one batched direct get
// (multi_last, nats-server 2.11+) on KV_<Results>. Store.LookUpShared
// amortizes across keys: the groups of the tenure's lanes that ask while
// a look-up is in flight go together in the next round, one request (on
// a catalog a key's group is one job, so a look-up per group was one per
// job); a group is answered only from a request made after it asked
// (TestLookUpSharedGathersConcurrentGroups, here). Any replica may answer
// a direct get, so the answer counts only where a lagging replica cannot
// mislead: a kept outcome is kept (outcomes are never deleted; a dead
// letter's, the one a redrive replaces, only from a current replica), and
// "none kept" only from a replica whose last sequence is at or past the
// tenure's mark (the newest outcome this tenure kept, Store.NoteKept;
// until it kept one, the stream's newest message as its leader says). An
// ID not settled so is left to the caller's per-ID look-up, LeaderGet, a
// get the stream's leader answers. Value reads an entry: a delete, purge
// or removal marker (Removed) is none kept; a value that does not decode
// is an outcome whose error is an *UnreadableError, never "none": the job
// may have finished, so it is dead-lettered rather than run again.
//
// # Outcomes in one atomic batch
//
// Store.KeepBatched sends a group's outcome puts as one JetStream atomic
// batch (nats-server 2.12+, a stream with AllowAtomicPublish: Setup sets
// it, AllowAtomicPublish) with one ack; it notes the commit's sequence as
// the mark. A refusal (BatchRefused) has the caller put them one by one at
// once; Memory remembers it (off for BatchPause, or a halved size).
// Store.KeepShared, the tenure's way in, gathers the puts of the groups
// of its lanes that keep while a keep is in flight into the next round
// (shared.go, as the look-ups), one batch when the round holds at least
// Config.BatchMin puts, one by one otherwise (PutEach); without BatchMin
// each group's puts go at once, as before
// (TestKeepSharedGathersConcurrentGroups,
// TestKeepSharedRoundRefusedGoesOneByOne, here).
//
// # Batch entries
//
// A batch message's Calls may keep their outcomes in one entry
// (wire.BatchOutcomesKey), bound to the message that earned it by a header
// (HeaderBatchOrigin, BatchOrigin) and written only over the revision read
// on receipt (EntryRev, PutEntry), so a batch ID used again (another
// shard's stream, or after the duplicate window) never writes over
// another message's outcomes. ReadEntry reads one back as the leader
// holds it. Both reads are leader gets on a replicated results stream,
// and direct gets, which its one server answers, on a one-replica one
// (Config.Single): the claim is one read per batch message of Calls, and
// a leader get is a JSON API request the server queues and answers in
// JSON.
//
// # Failure cases
//
// Each is handled here; most are shown by whole-worker tests in the root
// package (they need a Worker, its owners and the root's test harness):
//
//   - A batched answer that is not complete (cut short, a load error, 413,
//     500, an entry not asked for or twice, no sequence, a timeout) settles
//     nothing; each ID goes to the leader (TestReadKeptAnswer, here).
//   - A replica behind the mark: its misses, and its dead-lettered hits,
//     go to the leader (TestStoreLookUp, here, with a mark ahead of the
//     server; TestBatchedMissFromALaggingReplicaGoesToTheLeader,
//     TestBatchedDeadHitFromALaggingReplicaGoesToTheLeader).
//   - A server that refuses the batched look-up (408 before 2.11, 503 with
//     nobody answering direct gets, a permissions violation, probed once
//     with a flush) turns it off for a minute: one ID at a time, no failed
//     request per group (TestReadKeptAnswer;
//     TestKeptLookUpFallsBackWhenBatchRefused). A results stream without
//     direct gets gets them from Setup (EnsureDirectGets;
//     TestSetupAllowsDirectGetsOnResults). A lone ID with no look-up in flight is one
//     plain get (TestLoneJobLooksUpWithOneGet); a group's IDs, and the
//     groups gathered while a look-up is in flight, one request
//     (TestGroupLooksUpKeptOutcomesAtOnce, TestKeptLookUpTraffic).
//   - A kept outcome that does not decode is never "none kept": the job is
//     dead-lettered, not run again (TestStoreLookUp, here;
//     TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain,
//     TestGarbledBatchEntryNeverRunsTheJobAgain).
//   - Atomic batches refused (10174 the flag off, an ack that does not
//     name the batch from a server before 2.12, a malformed batch): put one
//     by one now, no batch for BatchPause; too large (10199): half the
//     size; too many in flight or incomplete: one by one now, batches stay
//     on (TestKeptBatchRefusals, TestBatchStoredNeedsTheBatchInTheAck,
//     here; TestKeptOutcomesFallBackWhenBatchesRefused). A batch whose
//     outcome is unknown (no ack in time, no leader) is an error the caller
//     retries with backoff. Batching itself: TestStoreKeepBatched, here;
//     TestKeptOutcomesGoAsOneBatchPerGroup,
//     TestOutcomeBatchDefaults, TestKeptOutcomesBatchedOnACluster,
//     TestRedriveKeepsBothIDsInOneBatch, TestSetupAllowsAtomicPublishOnResults.
//   - A batch ID's entry that is another message's is never written over
//     (ErrBatchIDTaken) and the batch is refused on receipt; an entry
//     written by this message whose ack was lost is written over
//     (TestStoreBatchEntryIsBoundToItsMessage, here, with leader and with
//     direct gets; a direct get refused or not answered is asked of the
//     leader, TestEntryReadFallsBackToTheLeader, here;
//     TestForgedBatchIDNeverOverwritesItsEntry); one that keeps changing
//     under the write fails it after three tries, for the caller to retry.
package kept
