// Package namespace makes, opens, checks, upgrades, lists and deletes the
// server objects of one keylane namespace: its jobs streams (one per
// shard), the delays and dead-letter streams, and the leases, members,
// results and state buckets; it reads and writes the jobs streams'
// metadata (N, the hash, the format version, shards, epochs, the reply
// prefix, the per-key cap, delays, MaxDeliver) and changes N
// (Repartition). jetstream/doc.go, "Topology", "A re-created jobs stream",
// "Repartition" and "Shards", describes the objects and the protocol.
//
// The main type is Topology: the opened objects of one namespace, made by
// Setup from an explicit Config (the fields of keylane.TopologyConfig,
// plus the worker's MaxDeliver, which keylane.WorkerConfig fills in).
// The operator's calls (Open, AdoptEpoch, Repartition, NamespaceObjects,
// LiveLeases, DeleteNamespace, ShardLeaders, SpreadLeaders) take a
// jetstream.JetStream and a namespace name and hold no state. Names
// derives every object name from a namespace; Meta is what a jobs stream's
// metadata says.
//
// Package keylane re-exports this package's API: Names, Meta,
// ShardLeader and RepartitionProgress as aliases, the Meta* keys as
// constants, the functions as thin calls, and its Topology embeds this
// Topology (its Config a keylane.TopologyConfig; NewState is keylane's,
// since State is). Nothing here knows a Worker or a Client: package
// namespace imports only internal/core, wire, partition, lease and
// internal/natserr.
//
// SubjectsVersion (meta.go) is the jobs stream format version: ReadMeta
// refuses a stream of another one, Setup and Repartition write it.
//
// # Failure cases
//
// Each is refused with an error that names both values and changes
// nothing; the test that shows it is in package keylane unless it says
// otherwise.
//
//   - Setup by many workers at once: every attempt is bounded
//     (setupAttemptTimeout), a failure that another attempt may cure (a
//     leader election, a concurrent creator's create) is retried with
//     backoff until the context ends, and what a concurrent creator made
//     is opened and checked (TestSetupByConcurrentCreators,
//     TestShardsConcurrentSetup). A mismatch, or a refusal no retry cures
//     (natserr.Permanent, such as replicas above 1 on a server that is not
//     clustered, 10074), ends it at once (internal/workercmd's run test
//     for 10074).
//   - Another partition count or hash: core.ErrPartitionMismatch
//     (TestSetupIsIdempotentAndRefusesMismatch); another replica count:
//     core.ErrReplicasMismatch (TestSetupRefusesOtherReplicas); another
//     shard count, or more shards than partitions: core.ErrShardsMismatch
//     (TestShardsMismatchIsRefused); another per-key cap:
//     core.ErrKeyBacklogMismatch (TestKeyBacklogCapIsFixed); delays on a
//     namespace made without: core.ErrDelaysOff
//     (TestDelayBadInputStoresNothing); another reply prefix or
//     MaxDeliver: core.ErrReplyPrefixMismatch, core.ErrMaxDeliverMismatch
//     (TestWorkerRefusesAnotherReplyPrefixOrMaxDeliver).
//   - A jobs stream of an older format (another keylane.version, or
//     delayed jobs kept in the jobs stream): core.ErrOldJobsStream
//     (TestOldSubjectSchemeIsRefused); a running worker that finds its
//     metadata refused says so (TestRunningWorkerSaysWhenTheMetadataIsRefused).
//   - A jobs stream found under the namespace's name whose subjects are
//     another namespace's ("a-b" and "a_b" share object names): refused,
//     wrapping core.ErrNoTopology, never given this namespace's subjects
//     (TestNamespaceOfAnotherSpellingKeepsOffAJobsStream); NamespaceObjects
//     refuses it too (TestDeleteNamespaceInUse).
//   - A jobs stream (or shard) deleted and created again gets a new
//     epoch; its keys' old state is refused with core.ErrEpoch until
//     AdoptEpoch (TestRecreatedJobsStreamIsRefusedUntilAdopted,
//     TestRecreatedShardIsRefusedUntilAdopted, TestCallOnARecreatedStreamSaysHeld).
//   - A stream made by an older keylane of the same format is upgraded in
//     place: exactly its partitions' subjects, atomic publish, its epoch
//     written down; the results bucket gets direct gets and atomic
//     batches (TestSetupAllowsDirectGetsOnResults,
//     TestSetupAllowsAtomicPublishOnResults).
//   - A stream frozen by a repartition in progress is left frozen by
//     Setup, which waits (TestSetupLeavesAFrozenStreamFrozen).
//   - Repartition: freezes, drains, replaces every shard with a new epoch
//     that adopts the old; a context that ends first unfreezes and changes
//     nothing; delayed jobs still waiting make it refuse and unfreeze
//     (TestRepartitionKeepsEveryKeysState, TestRepartitionKeepsShards,
//     TestRepartitionWaitsForDelayedJobs); a client of the old N is
//     refused (TestStaleClientSubmitToAGonePartition).
//   - Delays on a server older than 2.12 (no message schedules):
//     core.ErrDelaysOff (TestServerAtLeast, here).
//   - DeleteNamespace refuses while a worker holds a lease
//     (core.ErrNamespaceInUse, TestDeleteNamespaceInUse), and never
//     deletes a bucket that only bears the namespace's name, with no jobs
//     stream beside it (TestDeleteNamespaceLeavesBucketsOfNoNamespace,
//     here).
//   - SpreadLeaders moves shard leaders by preferred step-downs and waits
//     for each new leader (TestSpreadLeadersOnCluster, here, on three
//     nats-server processes).
package namespace
