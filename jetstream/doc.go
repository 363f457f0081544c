// Package jetstream writes down how keylane runs on NATS JetStream: the
// namespace's streams and buckets, the client that submits jobs, the
// worker that owns partitions and runs them, and State for per-key state
// with exactly-once effect — each failure case, what keylane does about
// it, and the test that covers it. The code is in the root package
// keylane.
//
// Why the code left this package: it was the public API, under a name
// that clashes with nats.go's jetstream, so every file that used both
// imported one under an alias, and the root package was a file of aliases
// over it. The root package is now the API (as River's is), and nothing
// here is left that a user would import on its own: topology setup and
// inspection (Setup, Open, Topology, Names, Meta), the wire vocabulary and
// the operator's functions (Repartition, AdoptEpoch) are part of that API
// and are used with the client and worker. This package stays the place
// engineers from etcd or NATS read first.
//
// # Topology
//
// Setup creates, idempotently and safely from many workers at once (each
// attempt bounded, retried with backoff, what a concurrent creator made
// opened and checked; a refusal no retry cures, such as replicas above 1
// on a server outside a cluster, 10074, ends it at once: # Refusals), for a namespace ns (default "keylane"), with every
// object at the jobs stream's replica count (ErrReplicasMismatch for an
// explicit other one):
//
//	NS_JOBS     stream, subjects ns.jobs.0.* … ns.jobs.<N-1>.* (exactly the
//	            partitions: the server refuses any other subject; a job
//	            travels on its key's subject ns.jobs.<p>.<key token>, see
//	            # Admission control; with StreamShards S > 1, one stream
//	            per shard: see # Shards), WorkQueue retention, file
//	            storage, duplicate window ≥ 2m, MaxMsgsPerSubject =
//	            MaxKeyBacklog when set; with Delays also subjects
//	            ns.delay.<p>.* (submissions) and a source of NS_DELAYS's
//	            due copies (# Delayed jobs), never roll-ups or schedules;
//	            metadata keylane.partitions=N,
//	            keylane.hash, keylane.version=3, keylane.epoch,
//	            keylane.adopted, keylane.reply-prefix,
//	            keylane.max-deliver (written by the first worker); a
//	            keylane.batches of an earlier release is ignored
//	            (# Batches on the wire, Versions)
//	NS_DELAYS   stream (with Delays), subjects ns.sched.<p>.* (schedules)
//	            and ns.due.<p>.* (jobs stored when due); message
//	            schedules; only workers publish to it
//	NS_DEAD     stream, subjects ns.dead.<p>: failed and malformed jobs
//	NS_LEASES   KV, key p.<p>: partition leases (TTL = lease TTL, History 1)
//	NS_MEMBERS  KV, key = worker ID: live workers (same TTL mechanism)
//	NS_RESULTS  KV, key = job ID: results, when workers store them;
//	            key redrive/<job ID>: redrive tickets (# Redrive)
//	NS_STATE    KV, key = k.<base64url(resource key)>: State entries
//
// NS is ns upper-cased with '-' made '_', so "a-b" and "a_b" name the
// same objects. A jobs stream (or shard) found under ns's name whose
// subjects are not ns's belongs to the other spelling: Setup, Open,
// and NewClient refuse it at once, changing nothing, with an
// error wrapping ErrNoTopology (ns is not set up) that says so. Before,
// Setup of "a-b" (a worker's typo) gave a_b's jobs stream its own
// subjects, and a_b's clients then found no stream, while a client of
// "a-b" opened it and waited out every submit
// (TestNamespaceOfAnotherSpellingKeepsOffAJobsStream).
//
// Every client and worker reads N and the hash from the stream's metadata
// and refuses a mismatch (ErrPartitionMismatch): a job routed with another N
// would reach the wrong owner and break per-key exclusion. A client that
// outlives a change of N is caught twice: a partition subject that no
// longer exists has no stream, so its publish gets "no response from
// stream", on which the client reads the stream's metadata and returns
// ErrPartitionMismatch at once (TestStaleClientSubmitToAGonePartition;
// before, it published again until its context ended), and every job carries
// the N it was routed with (Keylane-Partitions), which the worker checks;
// a mismatch is dead-lettered and its caller told to re-open the client.
//
// The reply prefix and MaxDeliver are the namespace's too, and a worker
// configured with another than the metadata's is refused at Start, naming
// both values, like the other mismatches: ErrReplyPrefixMismatch
// (TopologyConfig.ReplyPrefix, fixed when the namespace is created; the
// clients take their inboxes under it) and ErrMaxDeliverMismatch
// (WorkerConfig.MaxDeliver, fixed by the first worker in
// keylane.max-deliver, since a job's attempts are counted across owners).
// Zero (empty) follows the namespace's. Tested by
// TestWorkerRefusesAnotherReplyPrefixOrMaxDeliver and, naming the flags,
// TestRunRefusalNamesTheFlag. Two first workers with different values
// starting at the same moment on a namespace without keylane.max-deliver
// may both write it (a stream update is no compare-and-set); the later
// value stands and the other worker is refused at its next start.
//
// The epoch is a random number fixed when the jobs stream is created (a
// stream made by an older keylane gets its creation time). State entries
// record it: sequences of one stream say nothing about another's.
//
// # Submitting
//
// Client.Submit validates each field by package wire's rules (see # The
// door) and the size, then publishes to ns.jobs.<xxhash(key) mod N>.<key token> with the
// key in the Keylane-Key header and the job ID in Nats-Msg-Id, and returns when the
// stream has stored it. Call adds a Keylane-Reply header naming a
// per-client inbox and waits for the worker's reply. SubmitMany publishes
// asynchronously with a bounded window.
//
// Clients survive leader changes and reconnects. Every request to the
// server is bounded. A publish whose ack does not come (lost with a
// connection or a stream leader) is published again with the same job ID
// (1s, doubling to 2s; 250ms after a "no stream leader" answer) until the
// caller's context ends; the stream drops a copy it has, and a copy asks
// the worker to look the ID up first (Keylane-Idempotent). Submit and
// SubmitMany do the same for failures a reconnect or an election cures. A
// missing stream is ErrNoTopology at once. Every Call's outcome is kept by
// ID (Keylane-Keep-Outcome), so a Call whose reply is lost — its own
// connection dropped, or the reply is 5s late for a stored job — also
// watches the results bucket and returns the kept outcome. It reads the
// key every second with bounded requests and watches it beside that; the
// watch's consumer-create request is bounded only by the caller's context,
// so it is set up on its own goroutine: one lost in a leader election, or
// refused to a client that may read the bucket but not consume it
// (docs/security/accounts.conf), once held the reads up until the
// caller's deadline (8 of 7,142 Calls hung 30s after a leader kill).
// Tested by TestCallRepublishesALostPublish, TestCallRecoversALostReply
// and TestSubmitRepublishesALostPublish (a fault proxy swallows or cuts),
// docs/security's "retried call" (the watch refused), and on three nodes
// by e2e/TestClusterSale.
//
// # Clients in other languages: Node.js
//
// clients/node (npm package @keylane/client, TypeScript on the official
// NATS JavaScript client) speaks the same protocol as Client: it reads
// the namespace's metadata the same way (N and the hash, shards, reply
// prefix, keylane.batches, the per-key cap; a missing jobs stream is
// no_topology, another N partition_mismatch), checks every field by
// package wire's rules before sending, builds the same job message (the
// conformance vectors in testdata/conformance decide), and republishes an
// unacked job with its ID as above (1s doubling to 2s, 250ms after no
// leader; a copy carries Keylane-Idempotent). Its calls carry
// Keylane-Keep-Outcome; a duplicate ack, a reply 5s late or a reconnect
// makes it read the kept outcome in NS_RESULTS (every 500ms, bounded
// reads), so a call retried with its ID after no reply gets the kept
// outcome and never runs the job twice. Every wait is bounded by the
// call's timeout (default 30s): no_reply, never a hang. Every job it
// sends is a batch message of one (# Batches on the wire), a job too
// large for a batch of several included; its reply tokens never start
// with "-", so workers never send it grouped replies.
// A permissions violation for the job's subject (the server says so only
// asynchronously, and no ack comes) ends the submit or call at once with
// refused, from the connection's status events. A refusal over the per-key
// cap is answered as Client answers it (see # Admission control): a job
// with the caller's ID returns its kept outcome, or counts as stored when
// the key's queue (read from the stream's leader) holds it, and is
// key_backlog_full only when neither; unknown_outcome when either read
// failed. Tested by clients/node/node_test.go: TestNodeClient
// runs node --test against a real server and real Go workers, and
// TestNodeAndGoBuyers sells the same SKUs to Node and Go buyers at once
// (no oversell, stock = start - sold, each sale applied once), and
// TestNodeBuyersThroughCuts cuts the Node buyers' connection three times
// mid-sale (every purchase answered, none applied twice; with the
// republish and the kept-outcome reads taken out, 4 of 80 went
// unanswered).
//
// # A run whose write was never answered
//
// A group's state write that was sent and then cancelled or timed out (the
// lease's trust ended under it, a slow server) may have landed: a
// redelivery then finds the job held and answers it without running it.
// A Reducer that implements UncertainCommitObserver is told so
// (CommitUncertain) instead of Committed(job, false); the e2e history
// checker counts such a run as possibly applied when its caller got a good
// reply, the stock check vouching for exactly-once. Before, it read as
// "not applied" and a loaded run failed TestPausedWorkerBatches on a
// worker that was not the paused one (TestCheckTraceExcusesAnUnansweredWrite).
//
// # Owning a partition
//
// A worker registers in NS_MEMBERS (a lease on its ID) and watches both KV
// buckets. Every worker computes the same desired owners from its view of
// the live members and the lease holders (partition.Assign, a sticky
// assignment): with W members each owns floor(N/W) or ceil(N/W)
// partitions; a member keeps the partitions it holds up to its share (its
// highest rendezvous-scored ones), and every other partition goes to the
// member with the highest rendezvous hash of (p, member) among those with
// room. So a joining worker takes only what the others hold above their
// new share, and a leaving worker's partitions go only to the others;
// nothing else moves. (Plain rendezvous hashing also moved only what had
// to move, but gave four workers on 16 partitions 3, 2, 6 and 5.) The
// balancer acquires a free partition it is desired for at once, and any
// partition left free for a whole TTL (its desired owner is not claiming
// it; it hands such an orphan to its desired owner after orphanHold
// TTLs); it hands over partitions whose desired owner is someone else
// alive. A worker hands over only what it holds above its share, so a
// partition it just released, free for a moment in its own view, is not
// desired for it again; a worker that starts alone owns everything and
// gives partitions away as the others join.
//
// A worker whose owner of p outlives its lost lease (a handler that
// ignores its context) writes a stuck mark, a lease of its own under
// s.<p>.<worker>, and every balancer bars it from p when it computes the
// desired owners (it neither keeps nor receives p; while marks exist the
// split may be uneven), so p stays with one other worker instead of bouncing
// between owners; the mark is released when the handler returns (logged at
// WARN, then ERROR reminders; Stats.Stuck). A bucket watch whose channel
// closes is opened again with a jittered backoff, and balancing pauses
// until both buckets are re-learnt.
//
// A lapse (the owner's renews failed for a trust window: its lease
// expired, not lost to another worker) ends the tenure; the release's
// delete often fails too, and the entry then expires by TTL. The worker
// takes p again when its view shows p free: the watch's delete or expiry
// marker, or, when the watch shows nothing (a watch's ordered consumer
// can stall while it cannot be re-created, nats.go retrying it on missed
// heartbeats without closing the channel), the balancer's own stale rule:
// a holder unrewritten for TTL and a half counts as free. The acquire
// records the worker as holder seen at that moment; until it did so
// (recording it as never seen, which the stale rule passes over), a
// lapsed tenure whose delete the watch never showed left p held by the
// worker itself, in its own view, for good: Owned 0, nothing acquired,
// lost or stuck, for as long as the watch stalled (60s in a CI run of
// TestNoJobRunsTwiceWithALaggingFollower; TestLapsedLeaseIsTakenAgain
// pins the recovery on one node after a cut, a swallowed or a slowed
// connection, with and without a running job).
//
// On acquiring partition p, the owner deletes and re-creates the durable
// consumer "p<p>": whatever the previous owner fetched and never acked is
// delivered again at once and in stream order, instead of after AckWait.
// WorkQueue retention guarantees the stream never has two consumers on one
// partition subject. Sequences any earlier consumer had delivered (the mark
// is carried from generation to generation in the consumer's metadata) are
// possible redeliveries: they are looked up in NS_RESULTS when results are
// stored, and their starts are counted in NS_STATE, so a job that crashes
// every worker that runs it is dead-lettered after at most MaxDeliver+1
// runs instead of blocking its key forever.
//
// The fence of a tenure is the revision of the lease's Create (package
// lease). Renews move the entry's revision, not the fence: they write the
// fence into the entry's value, so Inspect (keylane status, the status
// page, /status.json) shows the fence that Job.Fence, dead letters
// (Keylane-Fence) and the owner's logs carry. Tested by
// TestInspectFenceIsTheJobsFence.
//
// The balancer is package internal/balance: its doc.go writes down the
// assignment, the stuck marks and the failure cases it handles.
//
// # Running jobs
//
// One fetch loop per owned partition pulls batch messages (reading the
// next only while it holds fewer than MaxInFlight unfinished jobs) and
// hands each job of each to its key's lane. A lane runs one job at a
// time in stream order; a fixed pool of Concurrency runners serves the
// lanes, so different keys of a partition run in parallel and no goroutine
// is started per job. A hot key yields its runner after a burst when other
// lanes wait.
//
// A failing job is retried in place with backoff (its runner steps aside
// while it waits), so later jobs of its key wait behind it while other
// keys flow (see "A failing key does not hold its partition"); after
// MaxDeliver attempts, or at once for a Permanent error, it goes to
// NS_DEAD with Keylane-Error,
// Keylane-Attempts and Keylane-Worker headers and is acked. A state bucket
// that does not take a read or write (no leader, a cut connection, a full
// store: ErrStateUnavailable) is not the job's fault: the job is tried
// again with backoff while the lease is trusted, never spending its
// attempts, and the next try re-reads the entry, which settles a write of
// unknown outcome. Dead-lettering it instead told a buyer "failed" for a
// purchase whose write had landed (a non-leader kill on three nodes under
// load). Tested by TestStateOutageIsNotTheJobsFault (the bucket's store
// full) and e2e/TestClusterSale. Messages that are not valid jobs (no
// key, a key of another partition, a subject that is not its key's, an ID
// the results bucket cannot hold: see # The door) are dead-lettered as
// "malformed" and never reach the handler. Jobs waiting or running longer
// than AckWait/3 get InProgress so the server does not redeliver them.
//
// After the handler returns, the owner stores the result (optional),
// replies, and acks, and does each only while Lease.Trusted(): a worker
// whose trust window has closed neither replies nor acks. Lease loss
// cancels the handlers' context and drops queued jobs; the next owner gets
// them again.
//
// A partition's tenure (consumer, fetch, dispatch, execute, complete,
// hand-back, delayed moves) is package internal/tenure: its doc.go lists
// the failure cases it handles and the test that shows each.
//
// # Stopping
//
// Stop leaves the member set, stops fetching (draining the fetch buffer
// into the lanes), lets every fetched job finish and be acked, waits until
// the server has applied the highest ack (the ack floor reached it, or the
// WorkQueue stream no longer holds it) for as long as that takes within
// Stop's deadline (and at most AckWait), and releases the leases with
// compare-and-delete. Successors watching the lease bucket acquire at once:
// a graceful hand-over takes milliseconds and runs no job twice.
//
// The worker command stops so on its first SIGINT or SIGTERM, within
// --drain, and logs no disconnect warning for the connection it closes on
// purpose (TestRunLogsStop). A second signal while it drains ends the
// process at once, status 1, after an ERROR line saying so
// (cmdutil.SignalContext; e2e TestSecondSignalForcesTheExit): nothing is
// acked or released, so the jobs it held are delivered again to the next
// owner (which re-creates the consumer), and its leases expire after
// their TTL, as after a crash. No outcome is lost: an unacked job is
// redelivered, and one whose outcome was held is answered from it.
//
// # What the operator sees
//
// A worker's /readyz (on its --metrics address) is 200 only once Start
// returned (the namespace checked), while its connection is connected
// and before its stop began; 503 with the reason otherwise: while the
// server is away, while it drains (TestRunHealthAndReadiness). /healthz
// is 200 while the process answers.
//
// Failed lease renews are counted by the worker whether or not it has an
// Observer (Stats.RenewFailures, keylane_lease_renew_failures_total{worker}).
// An owner reports its own partitions' backlog; a partition nobody owns,
// and a namespace whose workers all died, are reported by every worker's
// metrics.Namespace collector (NewNamespaces: its own namespace and every
// other one the account lists), with the live workers, the dead letters
// waiting and each partition's lag and oldest waiting job
// (keylane_namespace_workers, keylane_unowned_partitions,
// keylane_unowned_backlog_jobs, keylane_dead_letters,
// keylane_partition_lag_messages, keylane_oldest_waiting_job_*, labelled
// by namespace, the same value from every worker: aggregate with max).
// Liveness is the server's: a member or lease entry not renewed for two
// thirds of the TTL, by the server's time stamps, is lapsed
// (lease.Lapsed), though the server keeps it until the TTL
// (TestAnotherNamespacesProcessReportsADeadNamespace). It reads the
// server at most every 10 s, bounded to 5 s and to 7 + shards + 2 x
// partitions requests a namespace (its own first: a worker's user, which
// may not list streams, still reports it: TestNamespaceGaugesAsWorker). A partition that had an owner keeps its
// consumer (owners re-create it, none deletes it), whose pending and
// unacked counts are its backlog; one that never had an owner has no
// consumer, and its jobs are what its shard stores beyond the consumers'
// counts (read a moment apart: a count, not a ledger). A read that fails
// (NATS away, no namespace yet) leaves those series out of the scrape and
// the scrape succeeds, keylane_nats_connected{worker} 0 saying why
// (TestNATSConnectedGauge, TestUnownedPartitionsAndTheirBacklog,
// TestDeadLettersGauge). docs/oncall.md lists the alert rules
// (docs/alerts.yml) and what to do for each.
//
// # No gaps: a job counts as applied only if its outcome is held
//
// Earlier versions took "sequence ≤ the key's stored sequence" to mean
// "applied". It was wrong: a delivery that never reached the worker (lost
// with a connection or a consumer leader, or taken by anything else that
// pulled once from p<p>, such as a deposed owner's iterator) came back
// after AckWait, below the sequence later jobs of its key had written, and
// was acked as applied with an empty result. Two mechanisms replace it.
//
// Delivery is gap-free. The owner checks every delivery's consumer
// sequence: it must be the previous one plus one (redeliveries get new
// delivery sequences too). A skipped delivery sequence, a reconnect of the
// worker's connection (nats.Conn status CONNECTED after RECONNECTING) or
// missed pull heartbeats stop dispatching at once — nothing delivered
// after the gap runs — and the owner re-synchronises: the lanes drop what
// is queued, what runs finishes and acks, and the consumer is deleted and
// created again, which delivers every unacked job again from the ack floor,
// in stream order. Re-synchronisations of one tenure are spaced by a
// backoff (20ms doubling to 1s) and counted in Stats.Resyncs.
//
// The pull nudge. nats.go v1.55.0's pull iterator decides on its next pull
// only inside Next, and skips it while the goroutine that sent the last
// one has not yet marked it sent. With a small pull batch (MaxInFlight 1
// or 2) and jobs waiting, the pull's job can arrive and be taken before
// that mark clears; the iterator then has no pull out and waits, silent,
// until its missed-heartbeat error 5s later, which must re-synchronise
// (a stored backlog at MaxInFlight 1, beside spinning processes, under
// -race: 2 of 4 runs re-synchronised, TestSmallWindowKeepsPulling). The
// owner therefore waits for a job at most 100ms (pullNudge) and then calls
// Next again without a deadline: that call makes the skipped pull, and,
// having no deadline, keeps nats.go's heartbeat watch, which restarts with
// every Next — a Next with a deadline each time would never see two
// heartbeats missed, and a silent connection would leave the owner with no
// pull out for as long as the silence lasts (TestMissedHeartbeatsStillResync
// failed so: no re-synchronisation within 15s).
//
// Re-creating the consumer in a cluster. After a node dies, the jobs
// stream, the buckets, the meta group and the consumers it led elect new
// leaders; nats-server's election timeout is 4-9s (randomised, not
// configurable). A request sent meanwhile gets no answer at all, so each
// request of a re-creation has its own short deadline (2s; the old
// consumer's info 500ms) and a failed attempt that waiting may cure (a
// timeout, no responders, a 503 "no leader", a connection being
// re-established) is tried again with the backoff for as long as the
// tenure lasts; the lease stays with the owner meanwhile, or lapses if the
// leases bucket is electing too. Once attempts have failed for 10s
// (longer than an election), the deadline doubles with each further
// failed attempt, up to 16s: a meta leader that answers the worker's server
// slowly (its replies held 3s behind on the route, the KV requests to
// the buckets' leaders quick) made every 2s attempt fail for as long as
// that lasted, the partition owned and running nothing
// (TestOwnerCreatesItsConsumerThroughASlowMetaLeader; ready 17-20s after
// the tenure began now, at the fifth attempt, under -race). A missing or replaced stream ends the
// tenure at once. (Until this was found, one 10s request covered the whole
// re-creation: a request lost in the election was waited out, and the
// tenure then ended, for 5-8s of extra stall: e2e/TestClusterSale
// leader-kill.) Two cluster effects remain and are bounded, not removed:
//
//   - The old consumer may be leaderless (its leader died). Its info is
//     then not waited for: the owner deletes it (a meta request, which
//     needs no consumer leader) and takes the stream's last sequence after
//     the delete as the delivered mark, so every job up to it is treated
//     as maybe delivered before (looked up, never assumed new).
//   - The new consumer is a new R3 Raft group, whose first leader is a
//     peer the server believes online. The server learns of a SIGKILLed
//     node only when its heartbeats have been missing for 90s, so for that
//     long it prefers the dead node one time in three, and the group waits
//     an election timeout. The owner waits 2s for the leader, then deletes
//     and creates the consumer again, which draws again.
//
// Measured on three nodes under a sale (TestClusterSale, lease TTL 2s): a
// partition resumes 0-2.5s after the meta group, the stream and the
// buckets have leaders again, up to 6s when every lease lapsed and a new
// consumer first drew the dead node (8.8s once, on a loaded CI machine);
// the elections themselves take 4-9s.
// Tested by TestStrayPullerLosesNoJob (jetstream and e2e) and
// e2e/TestWorkerConnectionCutMidDelivery (a fault proxy swallows deliveries,
// then cuts the connection).
//
// Outcomes are held. A State entry carries, with the value, the outcomes
// (stream sequence, job ID, result) of the key's last HeldJobs (1024) jobs,
// at most HeldBytes (256 KiB) of them, written by the same compare-and-set.
// A job whose ID the entry holds was applied: it is answered with its own
// result and not run. A job at or below the stored sequence whose outcome
// is not held never ran while later jobs of its key did: State returns
// ErrGap, and the owner dead-letters it with that error (its caller gets a
// dead-lettered RemoteError; Stats.Gaps counts it; the log says so at
// ERROR). It is never answered as a success. With gap-free delivery this
// happens only after a stream was restored from a backup (same epoch,
// sequences behind the state). The held window covers every job a
// partition can have applied but not acked (MaxInFlight, 1024 by default),
// so a redelivery after a crash or hand-over always finds its outcome;
// with results larger than 256 bytes on average the byte bound is reached
// first, and an applied job redelivered after more than 256 KiB of later
// results of its key is refused as a gap (loud, not silent; raise nothing
// to fix it but StoreResults, which answers it from NS_RESULTS first).
//
// An entry is one message, so it must also fit the server's max_payload
// (less 128 bytes for the compare-and-set's header): a large value with a
// full window may not. The window then shrinks, oldest outcomes first, to
// what fits, for that write (internal/statestore/fit.go); the outcomes of the group being
// written are never dropped. This is the trade the byte bound already
// makes, made sooner: a redelivery of an applied job whose outcome was
// dropped is refused as ErrGap (dead-lettered, loud, never applied twice
// and never a silent success), and retries by ID are answered from
// NS_RESULTS, where every job with a caller's ID (every Call, and with
// StoreResults every job) has its outcome kept before its ack; only a
// redelivery of a Submit without an ID, with StoreResults off, depends on
// the window. Such an ErrGap dead letter may stand for a job that was
// applied (its ack was lost after its outcome was dropped): redriving it
// would apply it twice, so read the key's state before redriving an
// ErrGap dead letter. (Refusing the shrink while a dropped outcome's job
// may still be unacked, or a "window cut below seq S" mark that lets the
// check answer "applied, outcome not held", would close this; neither is
// built.) An entry that does not fit even then (the value and the
// result, with the group's own outcomes: a group falls back to its head
// alone first) is refused with ErrStateTooLarge, permanently: nothing is
// written, the job is dead-lettered with that reason, the key moves on.
// Before, the write's "maximum payload exceeded" was taken for a state
// bucket outage and retried for ever (TestStateEntryOverMaxPayload,
// TestFitShrinksTheOldestOutcomes).
//
// Every group commit of a key rewrites its whole window, so the window's
// encoding is a hot key's cost per write. Entries are written in version 4
// (internal/statestore/codec.go): sequences as deltas, each job ID as the prefix it shares
// with the previous one plus the rest, a result equal to the previous one
// as one byte. A sale's hot key with a full window takes 14.5 KB while
// selling and 5.3 KB sold out, where version 3 took 52 KB
// (TestStateCodecCompactsAFullWindow). The window holds the same outcomes
// as before; only the bytes changed. Failure cases:
//
//   - A worker of an earlier release (versions 1-3 only) reads a version 4
//     entry as ErrBadState. Its handler path counts that as the job's
//     failure: nothing is written, the job is retried and after MaxDeliver
//     attempts dead-lettered with that error, and so is every later job of
//     the key while that worker owns it. Callers are told (a dead-lettered
//     RemoteError); nothing applies twice and nothing passes as a success,
//     but the jobs are not applied. So upgrade every worker of a namespace
//     before a new one takes partitions (stop the old ones first, or let
//     the new ones join only once all are new).
//   - A damaged entry (cut, a count or length beyond its bytes, a shared
//     prefix longer than the previous ID) is ErrBadState, never a shorter
//     window read as valid (TestStateCodecRefusesDamagedEntries); a cut
//     window would turn redeliveries into gaps or, worse, into new jobs.
//   - Tested end to end by TestStateFullWindowSurvivesTheBucket: a window
//     of HeldJobs written by group commits and read back by a new owner
//     answers every redelivery with its own result, and the job just past
//     it is ErrGap.
//
// A group commit costs what its group does, not what the window does
// (internal/statestore/heldlog.go). The owner keeps, with a key's cached entry, a held log:
// the window's outcomes in one growing array, each outcome's version 4
// encoding relative to the one before it, and, from the first look-up, an
// index from job ID to its newest outcome's position. The next entry
// appends the group's outcomes and encodings, moves the window's start
// past the oldest ones the bounds drop (the same bounds, counted the same
// way), encodes only its new first outcome on its own, and copies the
// kept encodings into its bytes; a job's held check is a map look-up, not
// a scan of 1024 IDs. The bytes are those the full encoder writes for the
// same entry, byte for byte, so nothing changed for readers: a worker of
// the previous build reads them. Per group commit on a sale's full window
// (BenchmarkGroupCommitWindow): 15 KB and 2 allocations for a group of one
// where the copy and encoding took 79 KB and 3, 34 KB against 153 KB for a
// group of 64; what remains is the entry's own bytes (the message) and,
// once every quarter window, a copy of the log to a new array. Failure
// cases:
//
//   - The log describes one entry, its head. A write built from an entry
//     whose log moved on (a concurrent State.Apply on the same key through
//     the same State, a write built and then not sent because the lease
//     went) copies and encodes in full, as before, and starts a new log;
//     its look-ups scan. Two writes never extend one log: an index that
//     answered for outcomes its entry does not hold would turn a job never
//     applied into a silent success (TestHeldLogSharedStateConcurrentApply
//     fails that way with the head checks removed).
//   - A failed or unknown write drops the cached entry and its log, as
//     before: the next attempt reads the entry, and its first write builds
//     the log and index from what it read (TestHeldLogRebuiltAfterReread:
//     an ID held twice answers with its newest outcome, dropped IDs are
//     not held; TestHeldLogRebuiltAfterLostWrite: after losing to another
//     writer, the rebuilt index holds that writer's outcome too).
//   - An adopted stream's entry, whose synthetic IDs next drops from the
//     middle of the window, and an entry whose last job has no ID take the
//     full path.
//   - Memory: the log keeps up to a quarter window plus twice the group
//     more outcomes than the entry holds (room to append before it
//     moves), and the index; both
//     are dropped with the cache (maxCached keys). The first write after a
//     read builds the log (it takes over the array next's full path
//     made): for a full window 213 KB and 2056 allocations with the read's
//     decoding, where main took 177 KB and 2053
//     (BenchmarkGroupCommitWindowCold), once per read.
//   - TestHeldLogMatchesFullPath (seeded; it prints its seed) compares
//     random sequences of groups, with re-reads and abandoned writes
//     between them, with the full path kept in the test: bytes, decoded
//     entry and every look-up. It fails if the incremental path drops or
//     repeats one outcome.
//
// A job whose fence is below the stored one comes from a deposed owner:
// ErrStaleFence, nothing written, and the owner steps down. See package
// lease for why fences, not leases, carry correctness.
//
// # A re-created jobs stream
//
// Deleting and creating the jobs stream restarts its sequences at 1. Its
// new epoch differs from the one recorded in existing state entries, so
// State refuses such keys with ErrEpoch: the owner holds the job (it is not
// the job's fault: it is neither retried towards MaxDeliver nor
// dead-lettered), logs the two epochs at ERROR, and looks again with
// backoff. A Call of a held job is told so once, at once: the owner sends
// a held notice on the Call's reply token marked with "=" (a client of an
// earlier build drops it and waits, as before), and Call returns a
// *HeldError (errors.Is ErrHeld, ErrEpoch and ErrNoReply): the job is
// stored, not failed; a Call again with its ID gets its outcome once it
// ran (TestCallOnARecreatedStreamSaysHeld). AdoptEpoch(ctx, js, ns, oldEpoch) records the old epoch in the
// stream's keylane.adopted metadata; workers re-read it on ErrEpoch, and
// the keys' state then carries over: held job IDs still answer retries,
// the old sequences are ignored. Tested by
// TestRecreatedJobsStreamIsRefusedUntilAdopted. A re-created leases bucket
// is package lease's: its revisions, hence fences, start above every
// earlier bucket's.
//
// # Changing N
//
// Repartition (the command: keylane repartition --to N) changes the
// partition count while workers run: it freezes the jobs stream (its
// subjects move off the partitions, so new jobs are refused at once and
// consumers keep draining what is stored), waits until the workers
// drained it (if the wait ends first it unfreezes, and nothing changed;
// a worker that starts meanwhile does not unfreeze it, its Setup waits:
// TestSetupLeavesAFrozenStreamFrozen), then replaces it with a stream of the new N whose epoch adopts the old
// one and whose sequences continue after the old last one. Workers look at
// the stream's epoch every lease TTL, and at once when an owner finds it
// changed (an owner never consumes a stream of another epoch than its
// worker's topology); they hand their partitions over, open the new
// topology (never creating a stream) and balance the new N. State stays in
// the state bucket, keyed by resource key, so every key keeps its state.
// Clients must be opened again; an old client's jobs are refused
// (ErrPartitionMismatch at publish for a partition that is gone, a dead
// letter for one that exists with another N). Its Calls are told at
// once, each with ErrPartitionMismatch and the worker's reason (the
// client checks the stream's N on a malformed refusal), batched ones too:
// a batch dead-lettered whole whose body still decodes answers each of
// its jobs that names a reply subject under the reply prefix, never
// another subject (before, a stale batching client's batched Calls waited
// out their deadlines: TestStaleBatchingClientCallsEndPromptly failed,
// "stale Call 0 ended after 20.083s with keylane: no result before the
// context ended"; TestBatchDeadLetteredWholeAnswersItsCalls). Tested
// by TestRepartitionKeepsEveryKeysState, TestStaleClientSubmitToAGonePartition and cmd/keylane's
// TestRepartitionCommand.
//
// # Shards
//
// One jobs stream has one leader: on a cluster, one server takes every
// submit, orders it, replicates it and acks it, and leads (usually) the
// consumers' deliveries. TopologyConfig.StreamShards = S spreads the
// partitions over S jobs streams:
//
//	NS_JOBS      shard 0: subjects ns.jobs.p.* for p % S == 0
//	NS_JOBS_<i>  shard i (1 ≤ i < S): subjects ns.jobs.p.* for p % S == i
//
// S = 1 (the default) is the layout above exactly: same name, same
// metadata, so existing namespaces and older clients keep working. With
// S > 1 every shard's metadata carries N, the hash, the reply prefix,
// keylane.shards = S and keylane.shard = i, and its own epoch.
//
//   - Routing does not change: the key's partition is xxhash % N, the
//     partition's subject decides the stream (the server stores a publish
//     in the one stream that holds its subject), and the client sets the
//     shard's name as Nats-Expected-Stream. A key never changes shard
//     while N and S stand, so per-key order and the one-owner rule are a
//     partition's, as before; the consumer p<p> lives on its shard's
//     stream. Group commit keeps one batcher per shard: an atomic batch
//     must stay in one stream.
//   - Striding (p % S), not ranges: no table to agree on, every shard gets
//     ⌊N/S⌋ or ⌈N/S⌉ partitions for any N (so N need not be a multiple of
//     S, though a multiple balances exactly), and S ≤ N is required.
//   - S is fixed when the namespace is created, like N: a client
//     (ClientConfig.StreamShards), worker or Setup that names another S is
//     refused with ErrShardsMismatch and nothing is changed; 0 follows the
//     namespace. Repartition keeps S and replaces every shard.
//   - Epochs are per shard, not per namespace. A shard is its own stream
//     with its own sequences, and a shard deleted and created again must
//     be told apart from the one it replaced, exactly as a lone stream is
//     (# A re-created jobs stream): Setup creates a missing shard with a
//     new epoch, owners compare the epoch of their partition's shard
//     before consuming, State compares a key's entry with the epoch of the
//     key's shard, and AdoptEpoch writes into every shard. Shards are
//     created independently, so concurrent workers need no coordination
//     beyond each stream's own create-or-open. Tested by
//     TestShardsRunEveryPartitionInKeyOrder, TestShardsMismatchIsRefused,
//     TestRecreatedShardIsRefusedUntilAdopted, TestRepartitionKeepsShards
//     and TestShardsConcurrentSetup.
//
// Placement. The cluster elects each stream's leader; nothing puts them on
// different servers: were elections uniform, three shards on three
// servers would land on three different leaders only 2 times in 9.
// ShardLeaders reports where they are (the
// command: keylane leaders), and SpreadLeaders moves an overloaded
// leader to the least loaded current follower with a stream leader
// step-down that names a preferred server (nats-server 2.11+; a stream's
// configuration may not name a preferred leader, only the step-down
// may). Elections after a failure or restart place leaders by chance
// again, so run it after those. The consumer leaders (one per partition)
// are elected on their own as well; they are not moved. Tested on three
// nodes by TestSpreadLeadersOnCluster.
//
// Scaling to more servers. With replicas R, every shard is stored by R
// servers; the leader of each does more (ordering, acks, and usually the
// deliveries). On 3 servers with R = 3 every server stores every job
// whatever S is, so shards only spread the leader's share: the gain is
// bounded by the leader's extra work over a follower's, and is nothing
// once the servers' CPUs are saturated (see the measurement below). On
// M > R servers the streams' replica sets are placed over different
// servers, so with S shards each server stores about R·S/M shards' worth
// of the jobs instead of all or nothing: choose S = M (or a multiple, so
// SpreadLeaders can put an equal number of leaders on each), N a multiple
// of S, and placement tags if the servers differ. The KV buckets (leases,
// members, results, state) stay one stream each; with the reducer the
// state bucket takes one write per group of jobs, and it becomes the
// next single leader to shard once the jobs streams are spread.
//
// Measured with the bench's cluster placement (bench --placement cluster
// --stream-shards 1,3: three nats-server processes on one loaded 2-core
// machine, R3, 16 partitions): on the skewed sale 3 shards made Call
// 0.72-0.77× as fast as 1 shard and Submit 1.06-1.47× (within the noise);
// the one-shard leader node spent only 2-18 % more CPU than a follower.
// On 3 servers with R3 and saturated cores there is nothing for shards to
// win, and splitting one raft group's traffic over three batches less.
// The report, with tables and commands: docs/bench-shards-2026-11-22.md.
//
// # Admission control
//
// TopologyConfig.MaxKeyBacklog = N refuses a key's job when the key already
// has N jobs stored and not finished, so a flash sale of 1,000 units is not
// queued a million purchases deep. The server does the counting and the
// refusing, atomically with the store:
//
//   - Each key has its own subject inside its partition's: a job of key k
//     goes to ns.jobs.<p>.<KeyToken(k)>, the token being xxhash64(k) as 16
//     hex digits (the hash that picks the partition; safe in a subject for
//     any key, and short). The jobs stream's subjects are ns.jobs.<p>.* and
//     the consumer p<p> filters on ns.jobs.<p>.*, so routing, ownership
//     and per-key order are the partition's, as before. The key itself
//     stays in the Keylane-Key header: order, lanes and state follow it.
//   - The stream has MaxMsgsPerSubject = N, Discard New and
//     DiscardNewPerSubject: the server refuses the (N+1)th message of a
//     subject and stores nothing (error 10077, "maximum messages per
//     subject exceeded"; on a cluster the leader also counts the
//     subject's proposals in flight). On a WorkQueue stream a job leaves
//     when it is acked, so the subject's count is the key's backlog:
//     waiting, fetched, running, retrying or handed back; a job leaves it
//     when it succeeded or was dead-lettered.
//   - The client maps that refusal to *KeyBacklogFullError (errors.Is
//     ErrKeyBacklogFull, with the key and the cap) in Submit, Call,
//     SubmitMany, atomic batches (a batch with a refused job is refused
//     whole, then sent job by job, so only the jobs over the cap are
//     refused) and Redrive (the dead letter stays:
//     TestRedriveIntoAFullKeyKeepsTheDeadLetter). It is not retried.
//
// Failure cases:
//
//   - A retry by job ID. The server checks Nats-Msg-Id before the limit,
//     so a copy of a stored job is a duplicate, never "full": Submit says
//     ErrDuplicate and Call waits for the kept outcome. A retry after the
//     duplicate window (or after a restart rebuilt the window without the
//     acked job) that meets a full key looks the job's kept outcome up
//     (one results get, only for jobs marked Keylane-Idempotent) and
//     returns it, or ErrDuplicate from Submit: a shop never answers "sold
//     out" to a purchase that went through. Tested by
//     TestKeyBacklogCapRefusesBeyondN and
//     TestKeyBacklogRetryOfAnAppliedJobGetsItsOutcome.
//   - A retry by job ID of a job still queued (no worker ran it yet, and
//     the duplicate window passed) meets the full key too, and has no kept
//     outcome. The client then reads the key's queue from the stream's
//     leader ($JS.API.STREAM.MSG.GET on the key's subject, never a direct
//     get, which a follower may answer from behind): its last message,
//     then the others in order up to it (an earlier copy is older than
//     that last one, and a subject never holds more than MaxKeyBacklog,
//     so at most MaxKeyBacklog+1 reads however fast the queue moves). A
//     job with the ID there is a duplicate (Submit: ErrDuplicate; Call:
//     waits for its outcome, which the worker keeps by ID). Not there, the
//     outcome is looked up once more (a copy acked during the scan had
//     its outcome kept before its ack); only then "full, nothing stored".
//     An error saying "unknown" (not ErrKeyBacklogFull) when the queue
//     cannot be read. The cost, on refusals of jobs with a caller's ID
//     only: two results gets and up to MaxKeyBacklog+1 leader reads. That read needs
//     $JS.API.STREAM.MSG.GET.NS_JOBS, which the shipped accounts.conf does
//     not give clients (they may not read jobs): such a client gets
//     "unknown" for this case, within one refusal check. Before, it said
//     "full, nothing stored" and the order was applied when a worker came
//     (TestKeyBacklogRetryOfAQueuedJobIsNotFull).
//   - Two keys with one token (a 64-bit hash collision, about one pair in
//     2^64) share a subject, hence a cap; nothing else. Whoever can craft
//     such a key can submit the real key's jobs anyway.
//   - A publisher that puts a key's job on another subject (no keylane
//     client does) would escape the key's cap: the worker dead-letters it
//     as malformed (TestMalformedMessagesAreDeadLettered).
//   - A publisher that puts a key's jobs into a batch message. The server
//     counts a batch as one message of its subject, so on a capped
//     namespace a worker reads a batch only as one job on that job's key's
//     own subject (wire.Rules.MaxKeyBacklog, from the stream's
//     MaxMsgsPerSubject); a batch on the batch subject, of more than one
//     job, or on another key's subject is refused whole, dead-lettered
//     with the reason, each of its Calls told. Before, 50 jobs of a full
//     key in one message on <ns>.jobs.<p>.batch all ran
//     (TestKeyBacklogCapHoldsForBatches failed: "key sku:full's state is
//     "53": 53 jobs of a key capped at 3 ran; want 3"). Uncapped
//     namespaces keep the batch subject's rules.
//   - Changing the cap. The server enforces a lowered or newly set
//     MaxMsgsPerSubject by deleting the oldest messages of every subject
//     over it, which would drop stored jobs; so keylane never updates it.
//     The cap is fixed when the namespace is created, like N: a non-zero
//     MaxKeyBacklog that differs from the stream's is ErrKeyBacklogMismatch
//     and nothing changes, 0 follows the stream, and every shard and a
//     repartitioned stream copy it (TestKeyBacklogCapIsFixed). To change
//     it, drain the namespace and create it again.
//   - A jobs stream made before per-key subjects (keylane.version below 3,
//     one literal subject per partition) holds jobs no consumer filter of
//     today matches: Setup, clients and the operator's functions refuse it
//     with ErrOldJobsStream and change nothing (pre-1.0: no migration;
//     drain it with the keylane that made it). Tested by
//     TestOldSubjectSchemeIsRefused.
//   - Per-subject bookkeeping costs the server memory per key with stored
//     jobs, not per key ever seen: acked jobs take their subject's entry
//     with them.
//
// # Delayed jobs
//
// WithDelay(d) and WithRunAt(t) submit a job that joins its key's queue at
// t (a seat's hold that expires), on a namespace created with
// TopologyConfig.Delays, using nats-server 2.12's message schedules in a
// stream of their own:
//
//   - The client publishes the job as a plain message to its partition's
//     delay subject ns.delay.<p>.<job ID, dots as '~'> in the jobs stream,
//     with the job ID in Nats-Msg-Id (a retried submit within the
//     duplicate window is dropped) and its time in Keylane-Run-At (RFC
//     3339, UTC). No schedule header: the jobs stream allows neither
//     schedules nor roll-ups, and refuses both at publish.
//   - The partition's consumer filters the delay subject too. Its owner
//     checks the submission (wire.Rules.ParseDelayed: the job's rules,
//     the subject the ID's, the ID required, Keylane-Run-At required and
//     at most MaxDelay after the submission was stored; Keylane-Reply and
//     Keylane-Job-Id refused) and stores its schedule in the namespace's
//     delays stream NS_DELAYS, on ns.sched.<p>.<ID token>: built from what
//     passed the rules and the submitter's allowed headers
//     (wire.Rules.Schedule), with Nats-Schedule "@at <t>", a target of
//     ns.due.<p>.<key token>, the ID in Keylane-Job-Id, Keylane-Idempotent,
//     and as its own Nats-Msg-Id the submission's place (wire.MoveID:
//     the jobs stream's epoch and sequence). Then it acks the submission.
//     A refused submission is dead-lettered with the reason at its own
//     sequence, like a malformed job; a schedule the delays stream refuses
//     for good likewise ("the delays stream refused its schedule: …");
//     any other failure is a redelivery after backoff. The move runs
//     beside the fetch loop (at most 8 at once), so a slow delays stream
//     holds no other job.
//   - At t the server stores the job on ns.due.<p>.<key token> in the
//     delays stream (stripping Nats-Msg-Id, adding Nats-Scheduler naming
//     the schedule) and removes the schedule. Each jobs stream sources its
//     partitions' due subjects onto their keys' subjects
//     (ns.due.<p>.* → ns.jobs.<p>.<token>): the job arrives among its
//     key's jobs, marked by the server with Nats-Stream-Source.
//   - The worker takes the job's ID from Keylane-Job-Id only when
//     Nats-Scheduler names that ID's schedule in its partition and
//     Nats-Stream-Source names the delays stream (# The door), then
//     deletes the due copy left in the delays stream (best effort; one
//     left behind goes with the stream's MaxAge, 60 days).
//
// Only workers may publish to ns.sched and ns.due
// (docs/security/accounts.conf), and the server refuses Nats-Stream-Source
// and Nats-Scheduler from any publisher on the jobs stream: so the only
// way into a key's queue under a delayed job's ID is that job's own
// schedule. Tested by TestDelaysNamespaceKeepsItsDoorShut (a raw
// roll-up, a schedule purge and dressed-up due copies are refused at
// publish; a bare Keylane-Job-Id is dead-lettered; every honest job runs)
// and docs/security's TestDelayedJobsAsAccounts.
//
// What is promised, and why it holds:
//
//   - Order: the job arrives in its partition when it is due, so per-key
//     order is the order of arrival, which for a delayed job is its due
//     time: it runs after the key's jobs stored before it came due and
//     before those stored after. Tested by
//     TestDelayedJobRunsAtItsTimeInKeyOrder (a job submitted after it but
//     due at once runs first).
//   - Never early: the server stores it when its scheduler finds t passed
//     (the timer is re-armed at least 250ms apart); measured 3-28ms late
//     in that test, plus the source's copy (milliseconds). A submission
//     moved after t (its worker was down) is due at once.
//   - Once: a retried submit within the duplicate window is dropped; a
//     submission moved twice (its owner died before the ack, or a deposed
//     owner moved it too) carries the same MoveID within the delays
//     stream's window, and the server keeps one schedule per subject,
//     which is the job ID's, so a submit again after the window replaces
//     the waiting schedule (the later one wins) instead of adding a
//     second. If the server stops between storing the due job and
//     removing its schedule, it may store the job again after the
//     restart: delayed jobs are marked Keylane-Idempotent, so the worker
//     keeps their outcome by ID and answers the copy from it without
//     running it.
//   - Survives restarts: submissions, schedules and due copies are stored
//     messages (file storage, replicated like the jobs stream), the server
//     rebuilds its schedule index when it starts, and a source resumes
//     where it stopped (the server keeps its position). Tested by
//     TestDelayedJobSurvivesServerRestart (a server restarted with the
//     same store before t runs the job once, not early). A worker restart
//     does not matter: a submission not moved is moved by the next owner,
//     and after t it is an ordinary stored job
//     (TestDelayedJobSurvivesWorkerRestart).
//   - Bad input is ErrBadDelay and stores nothing: a negative delay, a t
//     further than RunAtTolerance (1s) in the past (within it, the job
//     runs at once), or beyond MaxDelay (30 days). A namespace without
//     Delays refuses a delayed job with ErrDelaysOff; Call refuses one
//     with ErrDelayedCall (a delayed job has no result to wait for;
//     submit it WithID and read Result later). Tested by
//     TestDelayBadInputStoresNothing.
//
// Limits, each refused with a clear error rather than half working:
//
//   - Delays excludes MaxKeyBacklog and MaxBytes: a due job the jobs
//     stream refused (its key or the stream full) would have nowhere to go
//     but the server's source, which copies due jobs in order. Delays is
//     fixed when the namespace is created (ErrDelaysOff for a namespace
//     made without). Setup checks the server's version first (message
//     schedules: 2.12 or later).
//   - A jobs stream of the first delays scheme (schedules in the jobs
//     stream, which then allowed roll-ups: a raw publisher could delete
//     queued jobs) is refused with ErrOldJobsStream: drain it with the
//     keylane that made it and create it again.
//   - Repartition freezes the streams, then refuses (and unfreezes) while
//     a delayed job is on its way: a submission not moved, a schedule
//     waiting, or a due copy the jobs streams have not sourced yet; it
//     would come due on its old partition's subject. Repartition once
//     they have run (TestRepartitionWaitsForDelayedJobs); the new streams
//     source the new partitions' due subjects.
//   - Client.Backlog and Inspect's per-partition Pending count a
//     submission until it is moved, not a schedule waiting in the delays
//     stream.
//
// # Retries by job ID
//
// Exactly-once by job ID, and a retry's answer, for a job submitted with a
// caller's ID (WithID, marked Keylane-Idempotent):
//
//   - within the server's duplicate window (TopologyConfig.DuplicateWindow,
//     2 minutes by default) the stream drops the second publish; Submit
//     returns ErrDuplicate, and Call watches the results bucket for the
//     job's outcome (at once if it finished, when it finishes if not);
//   - after it, for ResultsTTL (1 hour by default, the retry horizon): the
//     worker stores the outcome of every such job in NS_RESULTS before it
//     acks it (one atomic batch per group on a replicated namespace, so
//     group commit stays: "Kept outcomes in one batch" below), and looks a
//     new job with a caller's ID up there before running it (one batched
//     request for the groups of the partition's lanes that ask while
//     another is in flight, below); a hit is answered and acked without
//     running. The state entry's held IDs answer the same
//     question for the key's recent jobs at no round trip, and cover a
//     server that lost its duplicate table in a restart (a WorkQueue stream
//     deletes acked jobs, so the rebuilt table misses them).
//
// The look-up of a group's IDs is one batched direct get on the results
// stream, shared by the groups of the partition's other lanes that ask
// while one is in flight (they go together in the next round: on a
// catalog a group is one job; internal/kept, shared.go and lookup.go;
// nats-server 2.11+): {"multi_last":
// [subjects], "batch": n} on $JS.API.DIRECT.GET.KV_NS_RESULTS, at most 1023 IDs and
// the mark below (the server answers at most 1024 entries) and
// max_payload per request, bounded by the look-up
// timeout (5s). The server answers, from one consistent read of the
// stream, the last entry of each ID that has one, then 204 EOB (with the
// answering replica's last sequence, Nats-UpTo-Sequence); or one 404 No
// Results. Any replica may answer it, so it is trusted only where a
// lagging one cannot mislead (# Reads that decide): an outcome it has is
// kept, but "not kept" counts only from a replica shown current, whose
// EOB's Nats-UpTo-Sequence is at or past the tenure's mark (the newest
// outcome it kept; until it kept one, the stream's newest message as the
// leader says, one leader get per tenure). The request also asks for the
// mark's subject, so a current replica answers an EOB, never a bare 404
// (an empty stream's mark makes any complete answer current). Only such
// an answer says "not kept": an EOB with Nats-Num-Pending 0 after which
// the ID was not among the entries (a DEL or PURGE entry or a marker
// reads as none, as the per-ID look-up reads them). A value that does not
// decode is never "none": the job may have finished, so it is
// dead-lettered as unreadable rather than run again, by either look-up
// (the results bucket is written by workers only; before, it read as
// none and the job ran twice: TestGarbledKeptOutcomeByIDNeverRunsTheJobAgain). Anything else — a replica behind the mark, a cut-short EOB (the
// server's max bytes), 404 Message Not Found (a load error), 413, 500, an
// entry for a subject not asked for or twice, no sequence, a timeout —
// leaves the IDs unknown, and each is then looked up by key from the
// leader (retried with backoff while the tenure lasts): a failed look-up
// never runs a job. IDs that are no subject token sequence ("a..b") are
// looked up by key only, and so is a lone ID (one get, no inbox). A
// server that refuses the batched form (408 from a server before 2.11,
// which reads no request in the JSON; 503 with nobody answering direct
// gets; a permissions violation, which the worker's first batched request
// checks for with a flush) turns the batch off for that worker for a
// minute: no failed request per group. Setup sets AllowDirect on a results
// stream without it (a bucket made by keylane has it), in place. Workers
// need publish on $JS.API.DIRECT.GET.KV_NS_RESULTS and
// $JS.API.STREAM.MSG.GET.KV_NS_RESULTS (docs/security/accounts.conf has
// both). Tested by TestGroupLooksUpKeptOutcomesAtOnce (one request for 40
// IDs, kept ones not run, others run once in order; a group with none
// kept), TestBatchedMissFromALaggingReplicaGoesToTheLeader (an answer
// behind the mark: its misses are looked up again from the leader),
// TestBatchedDeadHitFromALaggingReplicaGoesToTheLeader (so are its
// dead-lettered outcomes, the one kind a redrive overwrites: trusted as
// they came, a retry by ID after a redrive could be told "failed" for
// applied work),
// TestKeptLookUpFallsBackWhenBatchRefused (a user denied the stream-level
// subject: found by key, nothing run twice, refusal remembered),
// TestReadKeptAnswer (each answer above) and
// TestSetupAllowsDirectGetsOnResults.
//
// The look-ups (and, where outcomes go in atomic batches, the kept
// outcomes) of several keys' groups were also tried in one request: the
// lanes of a partition that look up while another of its look-ups is in
// flight joined the next one (2026-11-29, base ca5230e). One batched get
// of 8 IDs cost a fifth of 8 leader gets in process, but with 64 buyers
// over 16 partitions few look-ups meet one in flight, and the bench did
// not move: skewed Call with caller IDs, the median of 9 runs of each
// build interleaved, 1,747 jobs/s and 235 µs/job of server CPU before,
// 1,707 and 225 with it; on the three-node cluster, outcomes of several
// keys in one atomic batch gave no gain either (skewed Call 669 and 701
// jobs/s against 656 and 623). A server profile of that sale shows why:
// stored messages (the job, its state write, its outcome) take about a
// fifth of the server's CPU, socket writes a tenth, the jobs consumers'
// state files (rewritten up to ten times a second each) 13 %, the
// leader gets 3-4 %. So each group still looks up and keeps alone.
//
// Jobs with generated IDs are retried only by keylane's own publishes; the
// duplicate window and the held outcomes cover those. A results write that
// fails leaves the job unacked: it is redelivered and answered from the
// held outcome, never lost and never applied twice.
//
// # Reads that decide
//
// On a replicated namespace a direct get (and a KV Get, which is one on a
// bucket with AllowDirect, as every keylane bucket has) may be answered
// by any member of the stream's direct-get group, followers included,
// from what they have applied. nats-server lets a follower into the group
// once it is 90 % caught up and does not take it out when it falls behind
// again, and hands each request to a random member: with one follower's
// replication 8 s behind (TestNoJobRunsTwiceWithALaggingFollower: R3, the
// route from the results leader to node 2 delayed through the fault
// proxy, which natscluster checks every route of the pair goes through
// and no other node's does; a worker crashes after keeping 24 handler outcomes and before
// acking; a new owner gets the 24 again), 10 and 11 of 24 jobs ran a
// second time with per-ID direct gets, none with leader gets. Even with
// no fault, a follower applies an entry only when it learns the commit,
// one heartbeat or message after the quorum did. So no decision to run or
// skip a job rests on a read a lagging replica may answer, unless its
// stale answer is harmless. Each read, the direction a stale answer would
// err in, and why that cannot run a job twice:
//
//	read                             how             stale answer, and why harmless
//	storedResult: a redelivered job  leader get      cannot be stale ($JS.API.STREAM.MSG.GET,
//	  or a lone job with a caller's   (leaderGet)     answered by the stream's leader only,
//	  ID (internal/tenure)                             after everything it acknowledged)
//	batched look-up of a group's     direct get,     "kept" is never wrong: an ID's outcome is
//	  IDs (internal/kept)             multi_last      written when its job finished and only
//	                                                  replaced by a later outcome of the same ID
//	                                                  (a redrive's), never deleted by keylane, so
//	                                                  a replica that has one is right that it
//	                                                  finished (a stale one may give a dead
//	                                                  letter's outcome a redrive since replaced);
//	                                                  "not kept" counts only from a replica at or
//	                                                  past the tenure's mark (above), otherwise
//	                                                  the ID goes to the leader
//	the tenure's first mark          leader get      cannot be stale; the stream's newest
//	                                                  message is at or past every outcome an
//	                                                  earlier owner kept (their leases ended
//	                                                  before this tenure began)
//	restart counter (countStart)     leader get,     the compare-and-set on its revision is the
//	                                  then CAS        leader's; read from the leader so retries
//	                                                  do not keep reading one lagging replica
//	                                                  until the loop gives up (a count not taken
//	                                                  lets a crash-looping job run on)
//	state entry (State.read, group)  direct get,     older entry: "held" (applied) stays true in
//	                                  then CAS        every later entry or was true when written,
//	                                                  ErrGap and a higher fence only grow, a
//	                                                  foreign epoch holds the job and reads again;
//	                                                  anything else runs the reducer and writes
//	                                                  with compare-and-set on the read revision,
//	                                                  which the leader refuses if stale, and the
//	                                                  retry re-reads. The cost: up to casTries
//	                                                  stale reads in a row (1/3 each with one
//	                                                  lagging member of three) end Apply with
//	                                                  "too many concurrent writers", a failed
//	                                                  attempt, not a wrong outcome
//	the tenure's state cache         memory          only this tenure writes the key (its fence
//	                                                  wins every CAS), dropped on any failed write
//	lease renew, acquire, release    CAS writes      decided by the leader (lease/doc.go)
//	lease read-back after a renew    direct get      only a revision past the one the conflict
//	  of unknown outcome (lookup)                     proved old is adopted; ours at or before it
//	                                                  is a stale read and stays unknown (Release
//	                                                  reads again until past it or its context
//	                                                  ends); a stale "not ours" ends the lease
//	                                                  (the safe side)
//	Call and Client.Result reading   direct get      not the worker's decision: Result may say
//	  an outcome (client/call.go, result.go)          ErrNoResult for an outcome kept moments ago
//	                                                  (Call reads and watches until its deadline);
//	                                                  a caller that resubmits by ID on it gets the
//	                                                  kept outcome from the worker's leader read,
//	                                                  nothing runs again
//	balancer views of the lease and  watch           who should own what; ownership itself is
//	  member buckets                                  the lease's CAS
//	what the previous consumer       consumer and    answered by the consumer's and the stream's
//	  delivered (prevDelivered: which  stream info     leaders; a job at or below it counts as
//	  jobs may have run)                               maybe run before (maybeDup)
//	Stop's "ack applied" check       consumer info,  leaders only: the jobs stream has no
//	  (settleAcks)                     jobs GetMsg     AllowDirect, so GetMsg is STREAM.MSG.GET
//
// Not covered: a previous owner's write still in flight when this tenure
// began (a pause after its last trust check) lands after any read, leader
// or not; the fence covers state writes, and a kept outcome that lands
// late is the same outcome. Two partitions using the same job ID (the same
// caller ID on two keys) are not ordered by the mark: a miss from a
// replica past this tenure's mark may still lack the other partition's
// outcome.
//
// Cost (go test -run '^$' -bench KeptLookUp -benchtime 2000x ., this
// shared 2-core VM, two runs, an order of magnitude): one look-up by ID
// took 22–26 µs as a direct get and 47–51 µs as a leader get on one
// in-process server; 89–139 and 158–225 µs on three nats-server processes
// with R3 (the client on node 0, wherever the leader was): about twice. A leader get also goes through the
// server's JSON API (the message base64 in a JSON body) and always to the
// leader, which serves every such read. Paid by redeliveries and lone jobs
// with a caller's ID; a group's batched look-up stays one direct get,
// plus one leader get per tenure for its first mark, plus a leader get
// per "not kept" ID only when the answering replica is behind.
//
// # Kept outcomes in one batch
//
// A group's outcomes (and a redriven job's, under both IDs) go to
// NS_RESULTS as one JetStream atomic batch (nats-server 2.12+): every put
// carries Nats-Batch-Id and Nats-Batch-Sequence 1..n, the last also
// Nats-Batch-Commit: 1; only the last has a reply subject, and the server
// answers it once all n are stored, with an ack naming the batch and n.
// That is one ack instead of n, one replicated proposal instead of n in
// R3, and one fsync of the stream instead of n on a server with
// sync_interval: always.
//
// Across keys: on a catalog a group is one job, so a batch per group
// would never reach the threshold, and each outcome would be a put, an
// ack and (sync_interval: always) an fsync of the one results stream,
// which serializes them. With OutcomeBatch set, the groups of a
// partition's lanes that keep while another keep of the tenure is in
// flight join the next round (kept.Store.KeepShared; an Applier's joined
// transaction commits many keys' groups at once, which then keep
// together): a round of at least OutcomeBatch puts is one batch, a
// smaller one goes as puts, and each group is answered when its round is
// stored. A round that fails is an error for each of its groups, which
// tries its own puts again, as before (TestKeepSharedGathersConcurrentGroups,
// TestKeepSharedRoundRefusedGoesOneByOne in internal/kept).
//
// When: WorkerConfig.OutcomeBatch, the fewest puts sent as a batch.
// By default 2 on a replicated namespace and never on one replica: there
// nats-server stages every batch in a file store of its own (a directory
// with its meta files written with fsync, removed after the commit), a
// fixed cost of several fsyncs per batch whatever the server's
// sync_interval. `go test -run '^$' -bench KeepOutcomes -benchtime 50x .`
// on the shared, loaded VM (an order of magnitude, no more): under the
// default sync_interval a group of 8 outcomes took 0.23 ms as
// asynchronous puts and 3.8 ms as a batch, a group of 64 1.1 and 4.4 ms;
// with sync_interval: always, 8 took 2.1 and 3.9 ms, 64 took 17 and 5.7
// ms. So on one replica a batch pays only when every write fsyncs and
// groups hold about 16 outcomes or more (the break-even depends on the
// disk: measure yours): OutcomeBatch 16 there. A negative OutcomeBatch
// never batches. A smaller
// group goes as before. Setup sets AllowAtomicPublish on
// KV_NS_RESULTS (a bucket made by an older keylane is updated in place;
// a server that refuses the flag leaves it off). The batch headers stay on
// the stored entries (about 77 bytes each: the benchmark counts 84-86
// bytes into the server per outcome against 8); readers use the value only,
// so older clients and workers read them as before, and older workers
// still write single puts into the same stream. The code is
// internal/kept, batch.go, with the atomic batch headers, which the state
// writes share.
//
// Limits (nats-server 2.15 defaults): at most 1000 messages a batch
// (JetStreamLimits.MaxBatchSize), 50 batches in flight per stream and
// 1000 per server, and a batch left uncommitted is dropped after 10s. A
// group holds at most 256 jobs (512 puts with redrives), so one batch; a
// longer list is split into batches of the limit, each committed before
// the next.
//
// Nothing is replied to or acked before the commit's ack: keepEncoded
// waits for it, so a Call retried by ID finds the outcome (the rule of
// "Retries by job ID" above). Failure cases:
//
//   - The stream does not allow atomic batches (10174: the flag is off,
//     e.g. turned off by hand), the ack does not name the batch (a server
//     before 2.12 ignores the headers and stores the puts one by one, the
//     earlier unacked), or the server calls the batch malformed: the same
//     outcomes are put one by one at once, each with its own ack (a put of
//     a value a refused batch may have stored is the same value under the
//     same key: harmless), and the worker sends no batch for a minute
//     (keptBatchPause), so it does not pay a refused batch per group.
//     Tested by TestKeptOutcomesFallBackWhenBatchesRefused (the flag
//     turned off under a running worker with a real stream update: one
//     refused batch, every Call's outcome readable when it returns, the
//     next group sends no batch).
//   - Too large (10199, a server with a lower MaxBatchSize): put one by
//     one now, and later batches are half the size (a refused batch of 3
//     or fewer turns batches off as above). Too many in flight
//     (10210) or incomplete (10176: a reply-less message dropped, the batch
//     timed out, a leader change): put one by one now, batches stay on.
//     The classes are TestKeptBatchRefusals'.
//   - No ack in time, no responders, not leader, a cut connection: the
//     outcome of the batch is unknown; keepEncoded's loop sends it again
//     (a new batch ID) with backoff while the lease is trusted, as it did
//     the single puts. The tenure ending first leaves the jobs unacked,
//     answered from the held outcomes when redelivered.
//
// Tested by TestKeptOutcomesGoAsOneBatchPerGroup (every group of a key's
// 60 queued jobs with IDs: one batch commit per state write, every outcome
// readable), TestOutcomeBatchDefaults (none on one replica by default),
// TestKeptOutcomesBatchedOnACluster (three nodes, R3: batched by default,
// none refused; once the worker acked every job, each outcome is read
// from the results stream's leader, which cannot miss one: a direct get
// right after seeing the put go by once read "key not found" from a
// follower),
// TestRedriveKeepsBothIDsInOneBatch,
// TestSetupAllowsAtomicPublishOnResults (an existing results stream
// without the flag gets it and keeps its entries) and, under
// docs/security/accounts.conf's least privilege, TestAccounts.
//
// # State writes of several keys in one batch
//
// On a catalog a key's group is one job, so the group commit's one
// compare-and-set per group (a put and its ack through the server, and in
// R3 one replicated proposal) is one per job. WorkerConfig.StateBatch
// coalesces the compare-and-sets of one partition's keys whose groups
// finish while another write of that partition is in flight, with the
// discipline of the client's batches (internal/batcher): a lone write goes
// at once, alone, as before; the writes that queued meanwhile go, when it
// returns, as one JetStream atomic batch (at most 64 writes and 4 MiB),
// each message carrying its own Nats-Expected-Last-Subject-Sequence (0
// for a new key), the last the commit. One request and one ack for all,
// one replicated proposal in R3. The batch is stored as consecutive
// messages, so each write's new revision is the commit ack's sequence
// less its distance from the last (the worker caches it for the key's
// next group; a wrong one would make that write conflict:
// TestStateWritesOfSeveralKeysGoAsOneBatch compares every cached revision
// with the stored one, and failed when every write was given the last).
// The code is internal/statestore/batch.go.
//
// When: only with StateBatch positive (the worker command's
// --state-batch, KEYLANE_STATE_BATCH; the bench's
// KEYLANE_BENCH_STATE_BATCH). It is off by default because the bench
// showed it does not pay. On one replica nats-server stages an atomic
// batch in a file store of its own (see "Kept outcomes in one batch"
// above): skewed Call went from 9,171 and 9,144 jobs/s to 2,515 and
// 2,318 with it (batched Calls 13,212 and 13,579 to 2,391 and 2,559;
// cd bench && KEYLANE_BENCH_STATE_BATCH=0|1 go run . --runs 1 --duration
// 2s --purchases 20000 --buyers 64 --placement separate --only
// 'skewed,Call', alternated twice, main 65ac6ff). On the three-node bench
// cluster (R3, the three servers on the same two cores), where the batch
// is staged in memory, it was slightly slower as well: batched skewed
// Call 3,562 and 3,421 jobs/s with it against 3,771 and 3,822 without,
// 416-435 µs/job of server CPU against 387-392 (the same command with
// --placement cluster and -1|0). So the acks a batch saves cost less than
// staging it; on a real cluster of three machines, where a proposal
// crosses the network, it may differ: measure before turning it on.
// Measured again on the one path, where every purchase carries its
// caller's ID and a skewed sale's group is one job (2026-11-29, base
// ca5230e, the bench binary run four times alternately with
// KEYLANE_BENCH_STATE_BATCH unset, 1, 1, unset: --runs 1 --duration 3s
// --purchases 20000 --buyers 64 --placement separate --only 'hot
// b=64,skewed b=64,keylane Call,keylane Submit'): skewed Call 1,385 and
// 639 jobs/s with it against 3,288 and 2,131 without (server CPU 514 and
// 690 µs/job against 171 and 260), skewed Submit 2,501 and 4,444 against
// 14,025 and 11,901; hot Call and Submit unchanged (one key: nothing to
// coalesce). It still does not pay; it stays off.
// A worker started with it sets AllowAtomicPublish on KV_NS_STATE (Setup
// does not: an R3 stream update each setup slowed the cluster tests' start
// for a lever that is off).
//
// Failure cases. Atomic means all or nothing, so:
//
//   - A refused batch stored none of its writes. A conflict (another
//     writer changed one key first: a new owner, a stale cache) refuses
//     the whole batch, so its writes go again alone at once, each with its
//     own ack: the conflicting one gets its conflict (the group re-reads
//     its key, as before) and its neighbours are stored. Tested by
//     TestStateBatchConflictIsOneKeys (a batch of three whose middle write
//     is stale: the other two stored with their reported revisions, only
//     the stale one conflicts, its key unchanged). A refusal of the batch
//     form itself (the flag off, too large, a server before 2.12) also
//     sends them alone, and the worker writes alone for keptBatchPause.
//   - No answer (timeout, a cut connection, no leader): every write of
//     the batch is an unknown outcome, exactly as one write's would be:
//     its group settles nothing, forgets the cached entry, and its next
//     attempt re-reads the key (a job whose outcome the stored entry
//     holds is answered from it, not applied again).
//   - The fence: a write is queued only while the lease is trusted and a
//     queued write whose context ends (the lease lost) is taken out
//     unsent; one already in a batch in flight is as a single write in
//     flight: its compare-and-set on the revision the owner read refuses
//     it if a newer owner wrote the key first.
//
// Tested on a cluster by TestStateWritesBatchedOnACluster (three nodes,
// R3, StateBatch on: batches stored, every job applied once).
//
// # The door
//
// Anyone allowed to publish jobs can send any message, so each field has
// one rule, in package wire, which the client applies when it builds a job
// and the worker again when it receives one.
//
// A submitter may send a key of 1 to 1024 bytes of UTF-8 without a control
// character (CR, LF, TAB, NUL, DEL, C1) or white space at either end
// (nats.go trims header values, so the worker would read another key than
// the one the subject was routed by); a job ID of 1 to 256 of A-Z a-z 0-9
// _ - = and dots, no dot first, last or next to another (the ID is a key of
// the results bucket, whose subject may hold no empty token); a type of at
// most 256 bytes of UTF-8 under the key's character rules, empty for none;
// a payload up to max_payload less DeadLetterReserve; and headers of its
// own (WithHeader, Request.Headers) whose names nats.go can send and whose
// values arrive as sent (no CR, LF or white space at either end), not
// under Nats-* or Keylane-* (any case) and not Status or Description
// (nats.go reads those as a status on a message without payload). The W3C
// traceparent and tracestate headers are a submitter's own.
//
// Refused at the client, nothing stored: a bad key (partition.ErrEmptyKey,
// ErrKeyTooLong, ErrKeyNotUTF8, ErrKeyControl, ErrKeySpace), ErrBadJobID
// (order..1; Result refuses it too), ErrBadType, ErrReservedHeader
// (WithHeader("Nats-Rollup", "sub") deleted the key's queued jobs on a
// namespace with delays; WithHeader("Keylane-Redrive-Of", …) forged a
// redrive), ErrBadHeader, ErrPayloadTooLarge.
//
// Dead-lettered at the worker, never run, acked once the dead letter is
// stored, its caller told when its Keylane-Reply is valid; Keylane-Error
// is "malformed: " and the first of these reasons (wire.Rules.Parse):
//
//	carries Nats-Rollup, which keylane clients never send (…)    a roll-up, see below
//	carries Nats-Schedule, …                                     a schedule, not a job
//	<header> header given <n> times                              Keylane-Key, Nats-Msg-Id, Keylane-Job-Id,
//	                                                             Keylane-Type, Keylane-Reply, Keylane-Partitions
//	bad Keylane-Key header: partition: …                         no key, or the key's rule broken
//	subject "…" is not key "…"'s (token …): …changed on the way  another key's subject, or a key sent with
//	                                                             white space at either end (it arrives trimmed)
//	key "…" belongs to partition <p>, arrived on <q>
//	routed by a client that counts <n> partitions, …             see # Topology
//	bad Keylane-Reply header: wire: reply subject is not …       see # Replies
//	bad Nats-Msg-Id header: wire: job ID must be …               or Keylane-Job-Id, a delayed job's
//	bad Keylane-Type header: wire: job type must be …
//	no JetStream metadata: …
//
// A delayed job's ID reaches the worker in Keylane-Job-Id (the server
// strips Nats-Msg-Id from the copy it stores when the schedule fires). It
// is taken only on a namespace with Delays and only from a due copy: a
// message whose Nats-Scheduler names that job's own schedule subject
// (partition.ScheduleSubject) and whose Nats-Stream-Source names the
// delays stream, two headers the server refuses from any publisher on the
// jobs stream (10212, 10188, 10227; see "Delayed jobs"). Anywhere else it
// is dead-lettered ("carries Keylane-Job-Id on a namespace without
// delays", "… was not made by that job's schedule", "… was not sourced
// from the delays stream"). Taken from anyone, it ran a publisher's
// message under a victim's ID and kept its outcome there: the victim's
// queued job was answered with it and acked without running
// (TestForgedDelayedIDIsRefused failed that way; on a namespace with
// delays, TestDelaysNamespaceKeepsItsDoorShut, with a forged
// Nats-Scheduler that the first delays scheme's jobs stream stored).
// Keylane-Run-At is read only on a delayed job's submission (its
// partition's delay subject); on a key's subject it is dead-lettered
// ("carries Keylane-Run-At on a key's subject").
//
// A dead letter names only what passed its rule: the job ID (in
// Keylane-Job-Id, whatever header it came in), the key only when it
// is the subject's and the partition's (a dead letter without a key cannot
// be redriven, so a redrive never applies a job to a key it was not routed
// by), the type, and the submitter's allowed headers; never a received
// Nats-* or Keylane-* header. Its own Nats-Msg-Id is wire.DeadID, the
// jobs stream's epoch and the job's sequence: the same stored job
// dead-lettered twice (a worker died before its ack) is stored once, and
// no other message can take its place. It was the job's ID: two stored
// jobs with one ID (one per shard, or a raw publisher's copy) made the
// dead-letter stream drop the second dead letter as a duplicate, and its
// job was acked as dead-lettered with none stored, a lost job
// (TestDeadLetterOfAForgedIDTakesNoOthersPlace failed that way). Readers
// take the job ID with wire.JobIDOfDead, which also reads an earlier
// release's dead letters (the job ID in Nats-Msg-Id). A failing delayed job carries the server's
// Nats-Scheduler and Nats-Schedule-Next (error 10188 on the dead-letter
// stream, which takes no schedules), one stored by atomic batches
// Nats-Batch-* (10174): copied, they made the dead-letter stream refuse
// the dead letter for ever, and the key stopped (for a malformed batch,
// which is dead-lettered on the fetch loop, the whole partition).
//
// What the server refuses at publish, on every jobs stream, with delays
// too: roll-ups (Nats-Rollup, error 10111), message schedules and
// schedule purges (Nats-Schedule*, Nats-Scheduler: 10188, 10212),
// per-message TTLs and counters (Nats-TTL, Nats-Incr), and
// Nats-Stream-Source (10227). The first delays scheme kept schedules in
// the jobs stream, which made the server allow roll-ups and schedule
// purges there: a raw publisher deleted a key's queued jobs, deleted a
// waiting delayed job, and ran a message under a victim's ID by dressing
// it as a due copy (TestDelaysNamespaceKeepsItsDoorShut failed that way).
// Schedules now live in the delays stream, which only workers publish to
// (see "Delayed jobs"); TestRawServerFeaturesAreRefusedAtPublish and the
// hostile-wire nemesis (every control header, Nats-Rollup among them, on
// a namespace with delays) hold it.
//
// A raw message with an empty payload and a Status header (a keylane
// client refuses one) is taken by nats.go's pull iterator for a status
// message from the server and never reaches the worker: it showed up only
// as a delivery gap, the partition re-synchronised, met it again and
// stalled for good ("delivery 2 after 0" re-syncs in the log; with some
// Status values the pull ends with an error instead). Now, when a first
// delivery shows a gap, the owner reads the partition's stored jobs
// between the newest delivery it had and that one (the stream leader's
// STREAM.MSG.GET, never a direct get): if they are exactly the missing
// deliveries and each is such a message, it dead-letters them ("malformed:
// an empty payload with a Status header, …"), deletes them from the jobs
// stream and goes on without a re-synchronisation (first deliveries come
// in stream order, so nothing else can be missing). Otherwise, and before
// any re-synchronisation (a gap, an error, missed heartbeats), it removes
// such messages where the swallowed one must be: behind the gap (at most
// 1024 read) or the next 16 of the partition after its newest delivery
// (internal/tenure, undeliverable.go). In the hostile-wire nemesis ~50 of them in 15 s cost
// the honest buyers nothing measurable; with a re-synchronisation each
// they cut the honest ops of the run from ~12,000 to ~2,200. WORKER_A in
// docs/security/accounts.conf holds the two requests this takes
// ($JS.API.STREAM.MSG.GET.A_JOBS, $JS.API.STREAM.MSG.DELETE.A_JOBS). A
// delete that fails after the dead letter was stored leaves the message,
// which the next gap dead-letters again: a second dead letter, never a
// lost job. Such a message that is the partition's last job shows no
// gap: nothing is delivered after it, and its redeliveries (one per
// AckWait) are swallowed too, so it stayed stored and unacked, never
// dead-lettered, for as long as the partition had no other traffic (e2e
// TestHostileWire's settle once waited 60 s on one, "1 jobs left"). Now a
// partition that receives nothing for max(10 s, AckWait) asks its
// consumer's info (one request per idle period); if the server delivered
// more than the owner received, and nothing arrives within a second more,
// it is a gap: such messages between the ack floor and the last delivery
// are removed as above and the partition re-synchronises (a delivery lost
// with no later one is found the same way). Tested by
// TestStatusLookalikeDoesNotStallThePartition (it
// failed before: the partition's later call got no result),
// TestSwallowedHeartbeatLookalikeNeedsNoResync (3 re-syncs for 3 before
// the gap check), TestTrailingStatusLookalikeIsRemoved (it failed before:
// the lookalikes stayed in the stream) and TestUndeliverableClearedAsWorker
// (as worker-a).
//
// Tested by TestJobIDTheResultsBucketCannotHold,
// TestFailingDelayedJobIsDeadLettered,
// TestFailingAtomicBatchJobIsDeadLettered,
// TestRawAtomicBatchOfMalformedJobs,
// TestReservedHeadersRefusedAtTheClient, TestRawServerFeaturesAreRefusedAtPublish and
// TestKeyWithWhiteSpace (each failed on main), package wire's tests, and
// the fuzz tests of every decoder (wire's FuzzParse and FuzzValidate*, the
// client's FuzzDecode*), whose seeds run with go test.
//
// For clients in other languages the door, the subjects, the hash and
// every message format are written down as keylane wire protocol v1 in
// PROTOCOL.md at the repository root, with conformance vectors in
// testdata/conformance (keys, field rules, encoded jobs and batches, kept
// outcomes, replies, and one malformed message per refusal above with its
// exact Keylane-Error). TestConformanceVectors makes every vector with the
// code (the client's message builder on a real server, package wire,
// package partition, the reply and outcome codecs) and fails when a file
// differs, naming the vector; KEYLANE_UPDATE_VECTORS=1 rewrites them. A
// reply answered from a kept outcome (a retry by ID) carries the same
// error text as the first reply, not the Go client's rendering of it
// ("keylane: job failed…"), which it did before:
// TestReplayedFailureReplyCarriesTheKeptText.
//
// # Refusals: permanent or transient
//
// Every NATS and JetStream error keylane meets is classified once, in
// internal/natserr (Classify), from nats.go's sentinels and the server's
// error codes; the retry loops of publishing, the partition consumer, the
// state write and Setup ask it. Permanent: no retry of the same
// request cures it, so it becomes a clear error for a caller or a dead
// letter with the reason, never "trying again". Transient: retried with
// backoff (bounded by a context, a lease or MaxDeliver as each loop says).
// Conflict: a compare-and-set lost; read again and decide again. Limit:
// a stream or bucket at its configured size; a publisher is told, a state
// write waits for room.
//
//	refusal                                           class
//	max_payload exceeded (nats.go, before sending)    permanent
//	10054 message over the stream's max message size  permanent
//	invalid subject, invalid KV key                   permanent
//	10188 schedules off, 10166 per-message TTL off    permanent
//	10174-10200 atomic batch refused or malformed     permanent
//	10074 replicas > 1 on a server without a cluster  permanent
//	10060 Nats-Expected-Stream differs                permanent
//	10059 stream not found                            permanent
//	10077 maximum messages per subject (key's cap)    permanent
//	permissions violation, connection closed          permanent
//	any other 400 or 404 API error                    permanent
//	10077 maximum messages or bytes (a full stream)   limit
//	10023 insufficient resources (storage used up)    limit
//	no responders, "no response from stream"          transient
//	503, 10008 cluster unavailable, 408, other 5xx    transient
//	timeout, deadline, reconnecting, disconnected     transient
//	10071, 10164 wrong last sequence; key exists      conflict
//
// What each does with them:
//
//	where                  permanent                         transient (limit)
//	Submit, Call, publish  returned at once; 10077 per       published again with backoff
//	                       subject: KeyBacklogFullError or   until ctx ends (limit: returned
//	                       a duplicate (# Admission)         at once); "no response from
//	                                                         stream": ErrNoTopology or
//	                                                         ErrPartitionMismatch at once
//	                                                         if the stream is gone or has
//	                                                         another N
//	state write (worker)   the job is dead-lettered with the an outage: the job waits with
//	                       refusal (max_payload: the window  backoff while the lease lasts,
//	                       shrinks first; ErrStateTooLarge)  no attempt spent (limit too)
//	Setup (worker start)   ends at once, logged at ERROR     retried with backoff, logged
//	                                                         at WARN (first, every tenth)
//	partition consumer     the tenure's attempt fails        retried while the lease lasts
//
// Conflicts keep their own handling: the compare-and-set loops read again
// (internal/statestore/cas.go, at most casTries). A stream not found is not permanent for
// Setup, where a concurrent creator may be making it.
//
// Tested by internal/natserr's TestClassify (every row, as nats.go
// returns it) and TestClassifyRealRefusals (a real server's answers).
//
// # Replies
//
// A worker replies only to subjects under the topology's reply prefix
// (TopologyConfig.ReplyPrefix, default "_INBOX.", fixed in the stream's
// metadata; clients take their inboxes under it; a worker configured with
// another is refused, ErrReplyPrefixMismatch). A job whose
// Keylane-Reply names anything else — the server's $JS/$KV/$SYS APIs, the
// namespace's own subjects, a wildcard — is dead-lettered as malformed and
// nobody is replied to: whoever may submit jobs cannot make workers
// publish with their permissions. Tested by
// TestInjectedReplySubjectIsDeadLettered.
//
// # Dead letters
//
// A dead letter always fits and is always one the dead-letter stream
// stores: its headers are built from the job's fields that passed their
// rules and the submitter's allowed headers (# The door), never copied
// from the received message; the error text is cut to 1 KiB, clients
// leave DeadLetterReserve (2 KiB) of max_payload free in every job, and a
// dead letter that would still not fit (a foreign publisher) drops its
// payload and says how long it was (Keylane-Payload-Dropped), then the
// submitter's headers. A dead-letter write that fails (the stream
// missing, a timeout) is retried with backoff while the lease is trusted,
// logged at ERROR and counted in Stats.DeadLetterErrors; the job stays at
// the head of its lane, unacked, and later jobs of its key wait: a lane
// never passes a job that was neither applied nor dead-lettered. A write
// refused for what the message is (a 400 answer: the stream's
// MaxMsgSize, a header it does not take; or max_payload) is never sent
// again as it was: it is sent once more bare (keylane's headers only, no
// payload, Keylane-Payload-Dropped). A bare dead letter holds only
// fields keylane checked, so a refusal of it means the dead-letter
// stream's configuration refuses every dead letter: that is logged at
// ERROR as the operator's to fix and retried with backoff, holding the
// lane as a missing stream does (acking the job without a dead letter
// would lose it silently). A malformed message (# The door) is
// dead-lettered on its partition's fetch loop, having no lane: while the
// dead-letter stream takes nothing, it holds the partition's fetching, as
// a failing job holds its key. Each dead letter stored is logged once, at
// WARN ("job dead-lettered", with its job ID, sequence, attempts and
// error: "malformed: …" for a message that was no valid job; a malformed
// message was logged twice before, TestMalformedMessageIsLoggedOnce).
// Tested by TestDeadLetterTooLargeStillFits,
// TestDeadLetterUnwritableHoldsTheLane,
// TestDeadLetterRefusedForGoodIsStoredBare and
// TestDeadLetterStreamRefusingBareDeadLettersHoldsTheLane.
//
// # Redrive
//
// Client.Redrive submits a dead-lettered job again as a new job of the
// same key, type and payload, then deletes the dead letter. Its ID is
// derived from the dead letter: the original ID plus the dead-letter
// sequence and a digest that takes in the time it was dead-lettered (a
// client, which cannot read the dead-letter stream, cannot guess the ID
// and take it first). The redrive travels as a batch of one, the redrive
// ID its job's caller's ID (flagged idempotent), with Keylane-Redrive-Of
// on the message: redriving one dead letter twice stores two messages
// and runs the job once, the second answered from the first's kept
// outcome (TestRedriveGoesAsABatchOfOneAndRunsOnce). A
// dead letter without a job ID (a producer that sent no Nats-Msg-Id) is
// redriven as redrive-p<partition>-<sequence>-<digest>; one of a delayed
// job carries its Keylane-Job-Id (the server strips Nats-Msg-Id when a
// schedule fires). Tested by TestRedriveWithoutJobID.
//
// A batch message dead-lettered whole (malformed framing, a partition
// count other than the stream's, fetched by a worker that does not read
// batches: # Batches on the wire) is stored as the batch: no Keylane-Key,
// the batch's body as payload (DeadLetter.IsBatch: no key, the body's
// "KLB" magic). Client.Redrive (and keylane dead redrive) decodes it and
// submits each job, in the batch's order, as it does one: checked by
// Submit's rules (key, type, headers; a job that breaks one refuses the
// whole batch, nothing stored), routed to its key's partition with the
// client's N (not the partition it was dead-lettered on), its headers
// kept, under an ID derived from the dead letter and the job's index
// (<batch ID>.<index>.redrive-<sequence>-<index>-<digest>, or
// redrive-p<partition>-… for a job whose ID is not its batch's and
// index's, which then gets no ticket: any other ID was the sender's
// choice, and may be another caller's), with a redrive ticket per job
// that names its batched ID, so Client.Result of that ID sees the new
// outcome. It stops at the first job not stored (a key's later jobs are
// never stored before its earlier ones) and deletes the dead letter only
// once every job is stored; run again, it stores the rest, and the jobs
// stored before are answered by the worker's look-up by ID of a job with
// its caller's ID, as for one job. A batch whose body does not
// decode is ErrMalformedBatch ("this dead letter is a malformed batch:
// nothing to redrive"), left in place. DeadLetter.RedriveJobs says what a
// redrive submits; --dry-run prints it. Tested by
// TestRedriveOfAWholeBatchDeadLetter (jobs of two partitions from a batch
// on one: a first redrive stored one job and was refused for the next,
// its key full, the dead letter kept; the second stored the rest, each
// job ran once on its key's partition with its type and header and
// answers under its batched ID; a batch with an empty key and a garbled
// one refused, nothing stored; before, every such redrive failed with
// "partition: key is empty") and cmd/keylane's
// TestDeadRedriveOfAWholeBatch.
//
// A redrive keeps the new outcome under the original ID too, so a retry by
// that ID sees it: the worker writes an outcome on the original
// submitter's behalf, so only an operator may ask for it. The job's
// Keylane-Redrive-Of header is only a hint. Before keeping the outcome
// under that ID, the worker reads the redrive ticket
// NS_RESULTS redrive/<new job ID> (a key no job ID can be: job IDs hold no
// '/') from the results stream's leader ($JS.API.STREAM.MSG.GET, never a
// direct get a lagging replica may answer). Client.Redrive writes it
// before submitting, with a Keylane-Redrive-Ticket header, naming the new
// job, the original ID, the key, the type and the payload's SHA-256; it
// lives for the bucket's TTL. Under docs/security/accounts.conf a client
// may not publish to $KV.NS_RESULTS.> at all (admin and workers may), so
// a client's Client.Redrive is refused and submits nothing. Without a
// ticket that matches, the header is ignored with a WARN log: the job runs
// as an ordinary job and its outcome is kept under its own ID only; a
// ticket read that fails is retried with backoff while the tenure lasts,
// like the outcome's write. A redriven job still queued when its ticket
// expires (after the results TTL) runs, but its outcome is not kept under
// the original ID. Tested by TestOnlyOperatorsRedrive (a raw publish and
// a Submit naming a victim's ID change neither the victim's kept outcome
// nor its next order, which runs) and TestDeadLettersRedriveAndPurge.
//
// keylane dead redrive and purge act on exactly what they are given: the
// sequences named (purge 2 deletes dead letter 2 only), or what the
// filters select (--key, --error, --job, --older-than, --newer-than,
// --from, --before, --limit; all given must hold), or with --all every
// dead letter (the filters may narrow it); a sequence together with a
// selection is refused, and so is no selection at all (exit 2). They print
// the dead letters they will act on, oldest first, and act only with
// --yes; --dry-run prints and stops. Purging every dead letter purges
// through the last sequence seen, never one dead-lettered since. dead list
// reads newest first, a page (--limit) at a time, the next page named by
// --before. A sequence or job with no dead letter exits 3 with "no dead
// letter at sequence N", never the server's error code. Flags work after
// the arguments in every keylane command. Tested by
// TestDeadCommandsHonourTheirFilters, TestDeadSelection and
// TestParseFlagsAfterArguments.
//
// # Operators' reads, and removing a namespace
//
// keylane state get KEY prints a key's state entry as InspectState reads
// it (one KV get on NS_STATE, decoded as a worker decodes it): the value,
// the last applied job's ID, sequence, batch index, fence and epoch, the
// entry's revision and the held outcomes, oldest first. A key without an
// entry (never applied through State, or deleted) exits 3 with a line
// that says so: a read that answered "none", apart from a failed read
// (1) and a usage error (2). An invalid key (empty, over 1 KiB, not
// UTF-8, a control character) is refused before any read, exit 1.
//
// keylane job ID finds a job's outcome where keylane keeps one
// (InspectJob): NS_RESULTS under the ID (a caller's ID, a Call, or every
// job with StoreResults); for an ID that names a batch and an index, its
// batch's entry (# Kept outcomes in one batch), read as Client.Result
// reads it (an entry that holds no outcome at the ID's index keeps only
// the batch's Calls: the job, a Submit of the batch or an index the batch
// never had, is looked for in the places below, not refused as a
// malformed entry: TestInspectJobOfABatchedJobNotInItsBatchEntry, whose
// dead-lettered Submit of a batch failed so before); with --key KEY,
// that key's held outcomes (a Reducer's job without a caller's ID keeps
// its outcome only there); and NS_DEAD, whose
// messages it reads headers only, oldest first up to the last one when it
// began, through an ordered consumer (deleted when the scan ends, else
// removed by the server after 30s idle: TestInspectJobLeavesNoConsumer
// found three left after three look-ups before; each pull of the ordered
// consumer replaces its consumer and deletes the one before on a
// goroutine, so one may outlive the look-up by a moment; it makes each
// one once: a refusal, the stream deleted under the scan, fails the
// look-up with the server's error, where nats.go's default tried again
// without end, bound by no context, and the look-up never returned:
// TestInspectJobEndsWhenTheDeadStreamGoesMidScan), each pull asking for
// exactly as many messages as remain (NumPending), so it never waits out
// a pull at the
// stream's end (a pull for a full batch sat out its 5s wait there, past
// the status page's deadline: TestLookupJSON). It says where it found the
// outcome; a kept outcome that says dead-lettered comes with its dead
// letter (the reason, partition, attempts, worker) when the stream still
// has it. Nowhere: exit 3, "not found", with how long each place keeps
// an outcome (the results bucket's TTL, the held window, the
// dead-letter stream's 7 days). A bad job ID is refused before any read;
// a namespace without a results bucket is an error (ErrNoTopology), not
// "not found". Tested by TestStateAndJobCommands,
// TestInspectJobInItsBatchEntry and TestInspectJobReadsEveryDeadLetter
// (past the first pull's 256 messages). The status page runs the same
// look-ups (?job=ID, ?key=KEY; TestLookupJSON, TestLookupsInABrowser),
// each read anew, at most statuspage.Config.MaxLookups (2) at once (one
// beyond is refused at once, saying so: TestLookupsAreCapped), so a look-up's page does not reload itself (it did
// every 5s, a dead-letter scan each time, for as long as the tab stayed
// open: TestLookupPageDoesNotReload); as a worker's user it needs the
// consumer permissions on NS_DEAD that docs/security/accounts.conf gives
// (TestStatusPageAsWorker).
//
// keylane namespace delete NS deletes NS's streams: NS_JOBS and its
// shards NS_JOBS_<i> (i > 0, digits only), NS_DELAYS, NS_DEAD and the
// buckets' KV_NS_LEASES, KV_NS_MEMBERS, KV_NS_RESULTS and KV_NS_STATE,
// as NamespaceObjects lists them from the server's stream list by exact
// name: another namespace whose name begins with NS (shop2 for shop) or a
// look-alike stream (SHOP_JOBS_X) is never touched. Namespaces whose names
// differ only in '-' and '_' share object names (Names); a jobs, delays or
// dead-letter stream whose subjects are not NS's is refused with an error
// and nothing is deleted. Without --yes it lists them and exits 1; while
// a worker holds a live lease of NS (LiveLeases) it refuses, deleting
// nothing, unless --force (the workers then fail their reads and writes:
// stop them first); a namespace with none of these streams is an error.
// The deletes run one stream at a time: one that fails stops the command,
// which prints what it deleted; run it again to finish (a stream already
// gone counts as deleted). Tested by TestNamespaceDelete.
//
// # A failing key does not hold its partition
//
// The server's window for a partition (the consumer's MaxAckPending) is
// shared by all its keys, and a delayed NAK does not free it: nats-server
// keeps a NAKed message pending until it is acked. So the worker keeps two
// windows: it holds at most MaxInFlight fetched jobs in memory, whatever
// batch message they came in (it stops reading the pull iterator when
// full; a batch of several read while below may take it past by its own
// jobs), and the server's window, in messages, is the
// larger MaxPending (16×MaxInFlight by default; a MaxPending that does not
// exceed MaxInFlight is refused, as it leaves a failing key's head and
// hand-backs no room). While a key's head job fails and retries (the key
// is stalled):
//
//   - Its head does not count against MaxInFlight, and it waits out each
//     backoff without holding its runner's place: a spare runner serves
//     the other keys meanwhile, so even Concurrency 1 keeps them running.
//     Once the backoff is over the head waits for a place again (fewer
//     than Concurrency runners holding one; a runner beyond that gives
//     its place up between two jobs), so the handler never runs more than
//     Concurrency jobs of the partition at once, retries included. Before,
//     heads coming back from their backoffs together all called it (4 at
//     once with Concurrency 2: TestRetriesStayWithinConcurrency). Memory
//     holds at most MaxInFlight jobs plus one retrying head (and one
//     goroutine) per stalled key; the server's window (MaxPending) bounds
//     how many keys can be stalled. A re-synchronisation of the partition
//     (see "No gaps") ends the backoff at once and leaves the head to the
//     new consumer instead of waiting for it to settle. (With MaxInFlight
//     1 or 2, a pull batch as small, nats.go's iterator used to stop asking
//     for messages now and then until the missed-heartbeat re-sync 5s
//     later: see "The pull nudge" below.)
//   - Its lane keeps keep = min(16, MaxInFlight/2) queued jobs that came
//     alone (a batch of one, whose message is handed back whole) and hands
//     the rest of those back with a NAK delayed by 1s (the server sends
//     redeliveries before new messages; a short delay would let a stalled
//     key's hand-backs crowd the others out). Its later arrivals are
//     handed back too, and a returning job is taken only when it is the
//     lowest of the key's handed-back jobs and the lane has room. The
//     kept jobs hold the window only while nothing else needs it: when
//     the window is full, no runner runs a job of a key that is not
//     stalled and no lane is ready, the highest job kept by the stalled
//     key keeping the most jobs that came alone is handed back (NAK
//     delayed 1s), one at a time until a job can be fetched, and a key
//     that so gave a job up keeps none (every job of it returning is
//     handed back again) until its head settles. A job of a batch of
//     several is never handed back (a message is acked or NAKed whole),
//     so a key keeping only those is passed over; they count in the
//     window all the same, and when nothing is left to hand back the
//     fetch loop reads the next message over the full window
//     (lanes.WaitRoom, counted by the lanes' Overflow) rather than wait
//     for a head to settle. Picked by its queue's length, such a key
//     handed nothing back and the partition waited for a head to settle
//     (TestStalledKeyOfBatchJobsDoesNotHoldTheWindow: MaxInFlight 4, key
//     a keeping five jobs of a batch, b and c two jobs each, alone or in
//     batches of several; another key's call went unanswered while the
//     three failed, issue 28's bug 5; with every job counted in the
//     window and no overflow, it went unanswered in both forms). So the
//     bound is: whatever MaxInFlight and however many keys are stalled,
//     the partition's next message is fetched once a job of a key that
//     is not stalled finishes, or at once when none runs; only
//     MaxPending (below) bounds what stalled keys hold, the jobs of
//     batches of several among it, in messages. Before,
//     nothing took kept jobs back, and MaxInFlight/keep stalled keys (2
//     when MaxInFlight ≤ 32, 64 at the default 1024) held the whole
//     partition until a head settled: after a jobs stream was re-created,
//     that many keys held for ErrEpoch stopped every key, new ones too.
//   - On the server, other keys keep their share until the stalled keys
//     have MaxPending − MaxInFlight jobs, their heads included, handed
//     back or retrying (15,360 by default); past that the server delivers
//     nothing new to the partition until a head settles, which MaxDeliver
//     and Backoff bound (ErrEpoch: an operator adopting the epoch).
//
// The way out. A key's jobs handed back and not yet returned are a gap in
// its lane: only its queued jobs below the lowest of them run, so the
// key's order holds. Once the head settled, nothing more of the key is
// handed back: every returning job is taken, in whatever order the server
// returns them (on a cluster, in interleaved clumps), and new arrivals
// wait in the lane behind the gap. So the gap closes once the server has
// returned the last job handed back, at most the 1s NAK delay (plus the
// redelivery) after the head settled, and the key runs normally while its
// traffic keeps arriving; a job is handed back about once per second the
// stall lasts, plus once. The one other hand-back: when jobs waiting
// behind gaps fill the in-flight window while no runner has other work,
// the highest of them that came alone goes back (NAK delayed 100ms), so
// the jobs that close the gaps can still be delivered (jobs of batches of
// several behind a gap let the next message in, as above). Before, a key with any job
// handed back handed back every new one and took a returning job only
// when it was the lowest: under steady traffic it never left that mode
// (64 callers on one key: ~600 calls/s at ~108ms after a 1.5s failure
// instead of ~9,500 at ~7ms, each job delivered up to 7 times on a
// cluster); and a stalled key kept 16 jobs and its head in the window,
// which held the whole partition when MaxInFlight was 17 or less.
//
// Counted in Stats.HandedBack; Worker.Tenures reports each partition's
// jobs handed back and not yet returned (Tenure.HandedBack), 0 once no key
// is stalled and the gaps closed. Tested by
// TestFailingKeyDoesNotStallItsPartition (a 400-job backlog on a window of
// 64), TestFailingKeyDoesNotHoldASmallWindow (MaxInFlight 1, 2, 16 and 17,
// and Concurrency 1: another key's calls answered while the head still
// fails), TestStalledKeysDoNotFillTheWindow (four keys failing at once
// with MaxInFlight 16 and 32: another key's calls answered while they all
// fail, each key's jobs applied in order once released; before, no call
// was answered), TestRetriesStayWithinConcurrency,
// TestWorkerConfigNeedsRoomBeyondTheWindow,
// TestHotKeyLeavesHandBackMode (64 callers on one key, through and after a
// failure of one of its jobs that the test ends: after it, 1000 calls
// answered with no job handed back and Tenure.HandedBack 0, with a reducer
// and with a handler; `go test -run TestHotKeyLeavesHandBackMode -v` logs
// the calls/s before and after), and, on the lanes alone,
// TestLanesGapClosesWhateverTheReturnOrder,
// TestLanesWindowBehindAGapHandsBackTheHighest,
// TestLanesStalledKeysGiveTheirKeptJobsBack,
// TestLanesBatchPartsCountInTheWindow,
// TestLanesWindowOfBatchPartsLetsTheNextIn,
// TestLanesPausedRunnerLetsOthersRun and
// TestLanesDroppingCloseEndsABackoff.
//
// # Group commit
//
// A worker with a Reducer writes a key's state once per group of jobs, not
// once per job. A lane runner takes up to 256 queued jobs of one key,
// reduces them in stream order on the cached state, and stores the outcome
// with one compare-and-set: the value, the last job's sequence, the fence
// and every grouped job's outcome (held in StateEntry.Recent). Only after that
// write landed, and only while the lease is trusted, does it reply to and
// ack each job. A group stops growing after 5 ms of reducing or 64 KiB of
// results, so a slow reducer does not hold the first caller's reply.
//
// Failure cases:
//
//   - The write fails or times out: its outcome is unknown. Nothing was
//     replied or acked; each job of the group goes through the one-job path
//     (re-read, retries with backoff). A job the landed write covers is
//     answered from the stored results without running again.
//   - A reduce fails: the jobs before it are committed and answered first,
//     then the failing job is retried alone (dead-lettered when permanent
//     or out of attempts), then the rest continue. Order is kept.
//   - The owner dies after the write, before the acks: the successor finds
//     the group's job IDs among the entry's held outcomes and answers them
//     without running them.
//   - A newer owner wrote the key: the CAS fails or the stored fence is
//     higher; the group is dropped and this owner steps down.
//
// # Group commit into the user's database
//
// A worker with an Applier (WorkerConfig.Applier, a GroupApplier; package
// keylanepg in module github.com/keylane/keylane/pg is one for PostgreSQL)
// groups a key's queued jobs as for a Reducer, up to 256, joins the groups
// of keys ready at the same time (below), and calls ApplyGroup with the partition's namespace, number and fence (the
// lease's fencing token). The applier runs them in one transaction of the
// user's database, recording in the same transaction each job's outcome
// (job ID → result) and the partition's fence, and refusing to commit
// when a newer fence has committed. Only after ApplyGroup returned, and
// only while the lease is trusted, are the Done jobs replied to and acked.
//
// Exactly once then rests on the database's record, not on NATS: a job
// redelivered after its owner died between the commit and the ack, or
// retried with the same ID after the duplicate window, comes back to
// ApplyGroup, which answers it from the record (Done, the recorded
// result) without applying it again. The results bucket still keeps a
// Call's (or a caller's ID's) outcome before its reply, as for the other
// runners, because Call recovers a lost reply, and waits on a duplicate
// within the window, from there; a dead letter's outcome is kept only
// there.
//
// Failure cases (the tests are keylanepg's, against a real postgres and
// nats-server):
//
//   - ApplyGroup fails with ErrStaleFence: a newer owner committed; nothing
//     was written and this owner steps down (TestPausedWorkerRefusedByFence:
//     an owner paused past its lease sends its transaction after its
//     successor committed, and the database refuses it).
//   - ApplyGroup fails otherwise (the database down or restarting, a cut
//     connection, a commit whose fate is unknown): nothing is replied or
//     acked; the group's head goes through the one-job path and the rest
//     back to the lane, and the attempt is tried again with backoff, the
//     job alone in its transaction, without counting against MaxDeliver's
//     attempts (dead-lettering it would tell its caller "failed" for a
//     commit that may have landed). The record answers what did commit
//     (TestPostgresRestartMidSale: postgres SIGKILLed twice mid-sale;
//     TestWorkerConnectionCutAtCommit: the connection cut right after
//     COMMIT reached the server, then mid-group). Such failures of the job
//     alone are counted all the same, but for those the Applier marks
//     ErrUnavailable (its database not there to answer: keylanepg's
//     connection failures and SQLSTATE classes 08, 57, 53, 58, 40): past
//     MaxDeliver of them, if the
//     Applier keeps a record (RecordReader) and the record is read (the
//     database is up), the job is answered from it if it committed and
//     dead-lettered for good if not — its own transaction is what fails
//     (keylanepg's TestWholeGroupFailureEnds); a record that cannot be
//     read keeps it trying. Every dead letter of an Applier's job, for
//     whatever reason (restarts past MaxDeliver included), reads the
//     record first (keylanepg's TestCommittedJobIsNotDeadLettered).
//   - ApplyGroup fails for good (its error errors.Is ErrPermanent:
//     keylanepg says so for SQLSTATE classes 42, 3F, 28 and 0A, e.g.
//     keylane's own table dropped or a privilege revoked): no retry cures
//     it until an operator acts, and it is not the job's fault either, so
//     the job is held as above, never dead-lettered for it; every attempt
//     is counted (Stats.ApplierRefusals) and said at ERROR, so it is a
//     page, not a WARN line repeating (TestApplierRefusingForGoodHoldsTheJob,
//     keylanepg's TestApplierSaysARevokedPrivilegeIsForGood).
//   - A job fails (the applier rolled back its writes alone, a savepoint
//     in keylanepg): the Done jobs before it are replied and acked, then
//     it is retried alone with backoff, or dead-lettered when permanent or
//     out of attempts; the jobs after it go back to the lane, and those
//     the transaction applied are answered from the record when they run
//     again. Held jobs (after a retriable failure of their key) run after
//     it, so the key's order holds.
//   - The owner dies after the commit, before the acks: the successor gets
//     the jobs redelivered and ApplyGroup answers them from the record
//     (TestWorkerSIGKILLedBetweenCommitAndAck: a worker process SIGKILLed
//     right after its commit; TestWorkerKilledBetweenCommitAndAck).
//
// One transaction carries the ready groups of several keys of the
// partition: a key's lane runner hands its group to the owner's batcher;
// if no transaction of the partition is in flight it goes at once, else it
// waits, and when the transaction ends every group that waited goes in
// the next one, together (one commit; the partition's transactions would
// serialize on its fence row in the database anyway). Each key's jobs stay
// in order and a job's failure is its own; a failure of the whole
// transaction (or a stale fence) is every group's
// (TestWorkerJoinsKeysInOneTransaction). At most Concurrency groups, of
// up to 256 jobs each, share one.
//
// # Grouped replies
//
// Most of a hot key's group are often Calls of one Client (64 buyers on
// one connection). After a group's outcomes are kept, and while the lease
// is trusted, the worker sends the replies of two or more of its jobs that
// go to the same client inbox as one message to <inbox>.- ; the client
// hands each entry to the Call waiting on its token. Then each job goes
// through finish as before (trust check, ack, observers, job log, its
// commit span), without a second reply. The one-job path (process, replay,
// dead letters, malformed jobs) still replies alone. A tool that watches
// replies on the wire (the e2e reply counter, which checks one reply per
// Call) reads a grouped one with keylane.DecodeGroupedReply.
//
// Only clients that say they take grouped replies get them: a client of
// this build starts its reply tokens with "-" (<inbox>.-1, <inbox>.-2, …),
// which base 36 never holds, so a previous build's client (tokens 1, 2, …)
// only ever gets single replies, and a previous build's worker answers a
// new client with single replies, which it still takes. The body is a
// version byte ('G'), then per job a uvarint-length token and a
// uvarint-length outcome in the kept-outcome encoding (kind byte o, e, p
// or d, then the result or the error text): the same result, error,
// permanent and dead-lettered a single reply carries. Today workers group
// only successes (a failed job's outcome goes the one-job path, alone);
// the client reads the error kinds too, so a later worker may group them.
//
// Failure cases:
//
//   - A group's replies would exceed the connection's max_payload: they
//     are split over several messages; one reply too big to share a
//     message goes alone. Tested by TestGroupedRepliesSplitAtMaxPayload.
//   - A malformed grouped reply (wrong version, a token not of the "-"
//     form, an unknown outcome kind, a repeated token, a length past the
//     end, bytes after the last entry): the client drops it whole, never a
//     part of it, and its Calls recover their kept outcomes as after a lost
//     reply (5s after the stream's ack). Tested by
//     TestMalformedGroupedReplyIsDropped (the server refuses the worker's
//     grouped replies; garbage naming the Calls arrives instead) and
//     TestGroupedOutcomeCodec.
//   - The grouped publish fails, or is lost with the connection: as a lost
//     single reply; the outcomes are kept before it, so the Calls recover
//     them. The jobs are still acked only after the publish was made.
//   - The lease stops being trusted before the grouped publish: nothing is
//     sent; finish then acks nothing either.
//   - An error with an empty text: replies carry "(no error text)", for
//     an empty Keylane-Error header reads as a success.
//
// Tested also by TestGroupedRepliesHotKeyOneClient (65 Calls, 2 reply
// messages), TestGroupedRepliesTwoClients, TestOldStyleTokensGetSingleReplies
// and TestGroupedReplyCarriesAnError.
//
// # Client atomic batches
//
// Removed with the one wire path: ClientConfig.AtomicBatches sent each
// job as a message of its own inside a JetStream atomic batch, so a
// server that syncs every write stored a batch with one fsync. A batch
// message (# Batches on the wire) stores the jobs of a partition that
// queued together as one message, one fsync, and is what every client
// sends now.
//
// # Messages, fsyncs and CPU per job
//
// What one Call with a caller's ID costs in messages through the server
// (each hop in or out of it counted once), for a key whose group commit
// settles n jobs from one client, before the speed work of 2026-11-23
// and now:
//
//	                                 before     now (one replica)   now (R3 or OutcomeBatch)
//	publish, stream ack              2          2                   2
//	delivery                         1          1                   1
//	kept-outcome look-up             2          2/n (batched get)   2/n
//	state write (group commit)       2/n        2/n                 2/n
//	kept outcome put and its ack     2          2                   1 + 1/n (atomic batch)
//	reply (worker in, client out)    2          2/n (grouped)       2/n
//	ack                              1          1                   1
//	total                            10 + 2/n   6 + 6/n             5 + 7/n
//
// Raw JetStream request-reply (publish, stream ack, delivery, reply in and
// out, ack) is 6. Batch messages (# Batches on the wire) make the
// stream ack 1/n too. What keylane still makes the
// server do beyond the raw row, per job: store the kept outcome (a KV
// entry per ID, kept for ResultsTTL), parse seven headers (about 230
// bytes: Nats-Msg-Id, Nats-Expected-Stream, Keylane-Key,
// Keylane-Partitions, Keylane-Reply, Keylane-Idempotent,
// Keylane-Keep-Outcome), and index a subject per key (admission control);
// per group, one state entry write and, for jobs with a caller's ID, one
// look-up (a batched direct get; a leader get for a lone one: # Reads
// that decide). There is no stream info request on the hot path.
//
// Fsyncs with sync_interval: always, counted with strace on the bench's
// durable hot key (3,000 Calls, embedded server, set-up included): 2.3 per
// purchase before, 1.48 now (jobs in client atomic batches, kept outcomes
// in atomic batches of 16 or more: OutcomeBatch, the default with
// --sync-always). What is left is one per job: the tombstone a WorkQueue
// stream writes, and syncs, when a job is acked (filestore removeMsg).
//
// CPU per job is what the bench reports for the server, the worker and
// the client apart (µs/job and allocs/job columns; profiles of each with
// KEYLANE_BENCH_CPUPROFILE=DIR). The largest single saving was not a
// message: the batched look-up first read its answer on a SubscribeSync,
// whose channel nats.go sizes at 64k slots (512 KiB cleared per group, a
// tenth of a hot worker's CPU); it now reads on a channel sized to the
// answer, and a dropped answer counts as unknown, never as "not kept".
//
// Not built: Limits retention with the owner purging up to the ack floor,
// which would remove the ack's tombstone and fsync. Each of these
// failure cases needs a design of its own first, and they are why
// WorkQueue stays:
//
//   - admission control counts a key's stored jobs (MaxMsgsPerSubject with
//     DiscardNewPerSubject); acked jobs kept until a purge would count
//     against the cap, and a hot key would refuse purchases until the
//     purge caught up;
//   - a take-over must start the new consumer at the old ack floor + 1;
//     when the old consumer's state is lost with its leader, a start from
//     an older purge point redelivers acked jobs, and a hot key's jobs past
//     its held window (1024) are indistinguishable from lost ones: they
//     would be dead-lettered with ErrGap (false failures and ERROR logs),
//     unless the floor were persisted with every group;
//   - WorkQueue refuses a second consumer on a partition's subjects, which
//     is the server-side guard against a stray puller (TestStrayPullerLosesNoJob);
//     under Limits only the lease and the fence would remain;
//   - Backlog, the status page and the metrics count stored jobs as
//     pending work; they would have to read consumer state instead.
//
// Also not built: acking a group at once (AckAll) — nats-server removes
// each acked message of a WorkQueue stream with its own tombstone and
// sync, so it saves ack messages but no fsync, and an AckAll floor held
// back by one slow key would redeliver every later job of its partition
// to a new owner.
//
// # Batches on the wire
//
// The one wire path (see "One path" below): the format (wire/batch.go),
// the send discipline (internal/batcher), the worker's reading
// (internal/tenure: batchpart.go, fetch.go's dispatchBatch) and the client's sending of
// Submit, SubmitMany and Call (internal/client/wirebatch.go), the batch index in the
// state entry and Calls' outcomes kept per batch (wire/outcomes.go,
// internal/tenure's batchoutcomes.go). Until 2026-11-28 batches were off by default, and
// the namespace metadata keylane.batches turned clients' batches on.
//
// Measured first, on main 8fade6d, separate nats-server, 64 buyers, one
// run (bench --runs 1 --duration 2s --purchases 20000 --buyers 64
// --placement separate --only 'hot,skewed,keylane,raw JS'): hot Call
// 18,532/s, CPU µs/job server+worker+client 40+26+18 = 84; skewed Call
// 9,753/s, 101+62+26 = 189; skewed Submit 25,507/s, 40+25+6 = 71; raw
// JetStream request-reply 44,195/s, 20+4+12 = 36 (hot and skewed alike).
// CPU profiles of the same rows (KEYLANE_BENCH_CPUPROFILE, the server's
// through its prof_port, go tool pprof -top -cum) say where it goes. In
// the server, per message, not per header: reading and routing
// (client.processInboundClientMsg) about 24 % of its CPU, storing
// (processJetStreamMsg) 15 %, the ack and its tombstone
// (consumer.processAck, fileStore.removeMsg) 11 %, delivering
// (client.deliverMsg) 12 %, socket writes 9-16 %; parsing keylane's
// seven headers (sliceHeader, getHeaderKeyIndex) is 3-4 %. In the worker
// (skewed Call): the state write's compare-and-set 16 %, the kept-outcome
// read and its JSON 12 %, stream acks' JSON 11 %, socket writes 12 %. In
// the client: building and checking the message with its headers
// (Client.message) 8 %, the stream ack's JSON 8 %, the flusher's writes
// 15 %. So the lever is fewer messages per job, not smaller headers:
// bytes per job in a body cost little; messages, acks and tombstones cost
// the CPU.
//
// The batch message. One stream message carries many jobs of one
// partition, of any keys, from one client:
//
//	subject   <ns>.jobs.<p>.batch   (not 16 hex digits: never a key's token;
//	                                 inside the partition consumer's filter)
//	headers   Nats-Msg-Id           the batch's own ID (22 letters and
//	                                digits from crypto/rand): the server
//	                                de-duplicates a resent batch whole
//	          Nats-Expected-Stream  as for one job (shards)
//	          Keylane-Batch         the body's format version ("1")
//	          Keylane-Batch-Jobs    the body's job count, which counting
//	                                reads without the body (Counting)
//	          Keylane-Partitions    N the client routed every job with
//	body      wire.EncodeBatch: version byte, job count, then per job the
//	          key, job ID, type, reply subject, flags (keep-outcome,
//	          idempotent), the submitter's allowed headers and the payload,
//	          each length-prefixed (uvarint)
//
// The worker reads the body with wire.DecodeBatch, which checks every
// field with the rules wire.Rules.Parse applies to a job (ValidateKey and the key's
// partition, ValidateJobID, ValidateType, ValidateReply under the
// topology's prefix, ValidateUserHeader) and returns, per job, the job or
// why it is refused. A job that breaks a rule is dead-lettered alone
// (malformed) and the others run; a body whose
// framing is broken (version, counts, a length past the end, bytes after
// the last job, over the limits), or whose Keylane-Batch-Jobs is missing
// or other than the body's count, is one malformed message,
// dead-lettered whole (TestBatchWithAWrongJobCountIsDeadLetteredWhole). Limits: at most wire.MaxBatchJobs (1024) jobs per
// batch, and wire.MaxBatchBytes (8 MiB, and the server's max_payload) per
// batch of several; a batch of one is bounded by max_payload alone (its
// payload is cut from the message, nothing is allocated in proportion to
// it), so a job too large for a batch of several travels as a batch of
// one up to max_payload (TestEncodeBatchLimits,
// TestDecodeBatchRefusesBrokenFraming, FuzzDecodeBatch's one body, one
// reading).
//
// When a client batches. Per partition, one batch in flight at a time
// (internal/batcher). A job for a partition with nothing in flight is
// sent at once, alone, as a batch of one (never delay a lone job). Jobs
// that arrive while a send is in flight queue; when it
// returns they go as the next batch, cut at 256 jobs or at the smaller
// of max_payload less DeadLetterReserve and 1 KiB of headers and
// wire.MaxBatchBytes (8 MiB), each less the body's head, whichever first
// (Client.batchRoom; a job over that room goes alone, as a batch of one,
// whose limit is max_payload less DeadLetterReserve; one over it is
// refused up front, ErrPayloadTooLarge). Under
// load a batch grows by itself to about the number of callers waiting on
// the partition during one round trip. One exception to "at once":
// ClientConfig.BatchCork (default 0) holds a job for a busy partition
// (its previous batch sent less than 4×BatchCork ago) for up to BatchCork,
// and sends it as soon as the batch is full. The callers of a busy
// partition come back together once their batch is answered; without the
// cork the first goes alone and the rest a round trip later, so a server
// that syncs every write stores (and an Applier commits) two for one. The
// bench's durable keylane → Postgres Calls gained 10 to 18% on the hot SKU
// and 15% skewed with a 1 ms cork (bench/internal/bench/postgres.go,
// pgCork). A quiet client's lone job still goes at once
// (TestCorkHoldsALoneJobOfABusyPartition, TestCorkSendsInTime).
// Tested by TestBatchesCutByMaxPayload (max_payload 64 KiB, jobs of 1000
// bytes: SubmitMany's and concurrent Submits' batches cut by bytes, every
// one stored, none over max_payload, every job run once in its key's
// order; a job over a batch's room goes alone and is stored; one over
// max_payload gets ErrPayloadTooLarge at once; with the room taken as
// wire.MaxBatchBytes the server refused the batch: "maximum payload
// exceeded") and TestBatchesCutByTheWireLimit (max_payload 12 MiB, jobs
// of 3 MiB from SubmitMany and concurrent Submits and Calls: every one
// stored and run, no batch of several over 8 MiB; a 9 MiB job goes alone
// as a batch of one over 8 MiB and runs, no message of another format is
// sent, one over max_payload gets ErrPayloadTooLarge; cut by max_payload only, three
// jobs made a 9 MiB batch that EncodeBatch refused, wire.ErrBatchTooLarge,
// and every job of it failed).
// SubmitMany, which holds its jobs at once, cuts each partition's run of
// batchable jobs the same way and publishes the batches asynchronously
// with its batches of one; a job that goes alone first publishes its
// partition's open batch, so a key's jobs are stored in the order given.
//
// One path. Every job the Go client submits travels in a batch message,
// lone jobs as batches of one, a job with a caller's ID (WithID) among
// them; on a namespace with a key backlog cap, where the server counts
// messages per key subject, a job goes alone as a batch of one on its
// key's subject (Client.alone), the only batch a worker accepts there
// (TestKeyBacklogCapHoldsForBatches); a second Submit with the same
// caller's ID is stored and runs once
// (TestRepeatedSubmitOnACappedNamespaceRunsOnce; before, a one-job
// message de-duplicated by the server). A redrive goes alone too, as a
// batch of one carrying Keylane-Redrive-Of, which a worker takes on a
// batch of one only; redriven twice it is stored twice and runs once
// (TestRedriveGoesAsABatchOfOneAndRunsOnce; before, a one-job message
// under the redrive's ID). A delayed job's submission is a batch of one
// on its ID's delay subject with Keylane-Run-At on the message
// (wire.Rules.ParseDelayedBatch; TestDelayedSubmissionIsABatchOfOne):
// the worker moves the job, with its own headers and payload, into a
// schedule as before, and the due copy the server stores from it is the
// worker's own message, not a producer's. A job too large for a batch
// of several goes as a batch of one as well. No client sends any other
// message, the Node client (clients/node) neither, and workers run no
// other: a one-job message (an earlier client's, or a raw publisher's)
// is dead-lettered unrun with a reason saying so, its Call (a reply
// subject under the reply prefix) answered at once with a permanent
// refusal, none of its headers acted on; a one-job delayed submission
// likewise (TestOneJobMessageIsRefused, TestMixedVersionClients). The one
// message of another form a worker runs is a delayed job's due copy,
// which only its schedule makes and the server marks (Keylane-Delayed-Id
// proven by Nats-Scheduler and Nats-Stream-Source: see "Delayed jobs").
// A jobs stream of keylane.version 3, whose clients could store one-job
// messages, is refused with ErrOldJobsStream and the drain to do
// (TestOneJobStreamIsRefused; docs/upgrading.md). There is no switch:
// ClientConfig.Batches and NoBatches,
// WorkerConfig.Batches, the namespace's keylane.batches, SetBatches and
// `keylane batches` are gone (the last answers with an error saying so),
// and every worker reads batches. Before, batches were off by default and
// turned on by `keylane batches on`, which took down running workers
// started without --batches (they stepped down and exited); and a shop
// sending every purchase with its order ID got none of the batch path,
// since a job with a caller's ID always went alone.
//
// De-duplication by a caller's ID is the worker's. A job with a caller's
// ID is marked idempotent in the batch body; the worker looks its ID up
// in the kept outcomes before running it (one batched request per round of groups,
// # Retries by job ID) and keeps its outcome by ID before it acks it, so
// a second job of the ID, in another batch or the same one, is answered
// from the first's outcome and never applied again. Two jobs of one ID
// queued at once (a Call retried by ID while its first copy waits: the
// server de-duplicates no job of a batch) are one job: a Handler looks
// each job up just before it runs, a Reducer's group counts what it
// settled as held, and an Applier's group ends before the second copy
// (groupEnd), which is looked up once the first's outcome is kept
// (TestRetryByIDInABatchRunsOnce; without groupEnd the Applier got both
// copies in one transaction, its outcomes table's unique key failed it,
// and the job ran twice). A batch message published again (its first
// copy's ack lost, or the first copy lost) carries Keylane-Idempotent,
// and the worker looks every job of such a copy up by ID before running
// it: a caller that called again by a job's generated ID (the one its
// no-reply error named) while the batcher still resent the batch has the
// job run once, the resend answered from the retry's outcome
// (TestRetryOfABatchedCallBeforeItsBatchResentRunsOnce; it ran twice on a
// plain Handler before). Not covered: a batched Submit without a caller's
// ID whose first copy was stored, retried by its generated ID after an
// ambiguous error, on a plain Handler, which keeps no outcome for a
// Submit: give a Submit that may be retried its own ID (WithID). A
// Reducer's held outcomes and an Applier's recorded ones answer it. Submit of an ID that
// ran before therefore returns nil, not ErrDuplicate: the job is stored
// again and answered from its outcome without running. A job not marked
// idempotent must carry its batch's generated ID (below: the worker
// refuses any other), and a resend of a whole batch is
// de-duplicated by the batch's ID. A duplicate answer to a batch's first
// copy is no copy of ours: another message had its ID, and the batch was
// dropped. It counted as stored once (every job of a SubmitMany
// said stored, none ran, when another client had stored messages under
// the IDs it worked out from nuids it read); it is now an error, "batch
// ID already used: not stored" (TestBatchUnderAUsedIDIsNotStored), and
// batch IDs, like the job IDs the client generates, are 22 letters and
// digits from crypto/rand, unguessable (internal/client/randid.go;
// TestPredictedBatchIDsLoseNoJobs). A duplicate answer to a later copy is
// the batch's own earlier one. So a batch whose stream ack does not
// come is published again whole, as it was (its batch ID), by publish's
// bounded retries inside the batcher's send; a job of it is never
// published again alone, which the server could not de-duplicate against
// the batch: the stream would hold the job twice. A batched Call
// therefore does not use Call's own republish (after callAckWait, under
// the job's ID): its stream ack is its batch's, and it waits for its
// reply only once the batch is stored (Client.callBatched). Tested by
// TestBatchedCallWhoseBatchAckIsLost (a batch of Calls stored, its ack and
// the replies swallowed: the batch is published again with the same ID
// and body, the stream stores it once, every job is applied once, every
// Call gets its own result from its kept outcome; a resend under a new ID
// failed it, the stream holding the batch twice, though a Reducer's held
// outcomes, the state entry's recent job IDs, kept the copy's jobs from
// being applied again there: a plain Handler has no such guard).
//
// The worker splits a batch into its keys' lanes. Each job becomes a task
// of its own whose position is (stream sequence, index in the batch): the
// index orders one key's jobs within a batch and keys the lanes' in-flight
// map. The task's message is a view of its job (batchPart: the job's
// subject, headers and payload as a one-job message would carry them), so
// finish, replies, traces and dead letters read it as a job; its Ack
// settles the job, and the batch message is acked once every job in it
// is settled (applied and its outcome kept, answered, or dead-lettered
// alone). Until then InProgress keeps it (once per half second for all
// its jobs). A job of a batch of several is never handed back (NAKed: the
// message cannot be half-NAKed): a stalled key keeps it queued behind its
// gap; a batch of one is handed back whole, as its key's stalled job.
// Every job counts in MaxInFlight's window; when jobs of batches of
// several that wait on failing keys fill it, so that nothing can run or
// be handed back, the next message is fetched anyway (see "A failing key
// does not hold its partition"), so they cannot stop the fetch that would
// close a gap or run a healthy key; they are then bounded by the server's
// MaxAckPending messages of at most 1024 jobs. Job.Seq stays the
// stream sequence (jobs of one batch share it). The state entry keeps the
// last applied job's Seq and its index in the batch (StateEntry.Index;
// entry version 5, written only when the index is not 0, so entries of
// one-job messages stay version 4 byte for byte), and the gap check
// compares (Seq, Index): a job of the batch after the one applied last
// runs, one at or before it whose outcome is not held is ErrGap. Before
// the entry kept the index, a dead-lettered job of a batch redelivered
// after a later job of its key and batch applied ran again, after that
// later job (TestStateAppliesJobsOfOneBatchInOrder failed that way).
// Tested by TestBatchMixingKeysWithDifferentFates (a poisoned job and a
// malformed one dead-lettered alone, the others applied once, the message
// acked).
//
// A redelivered batch (its tenure ended before the ack) is settled job by
// job from the held outcomes: every job of it is maybeDup; a job whose
// key's state entry holds its ID, or whose outcome is kept, is answered
// without running; the others run, in order. Nothing applied twice,
// nothing skipped. A plain Handler (no State) has no held outcome unless
// kept: its finished jobs of an unacked batch run again on redelivery
// (at-least-once, as for one job between its end and its ack today, but
// the window is the batch's). Tested by
// TestBatchRedeliveredAfterCrashBetweenApplyAndAck (the worker's connection
// cut after one job's state write, before the batch's ack: the next owner
// answers every job from the held outcomes and acks the message).
// A job of a batch that is dead-lettered keeps that outcome by its ID
// before it is settled, whatever the worker keeps otherwise, and every
// job of a redelivered batch is looked up by ID (then in its batch's
// entry) before it runs, so one dead-lettered while another job of its
// batch still ran is answered from its dead letter's outcome, never run
// again. Before, no state held it, and as its key's last job nothing
// stopped it: it ran and was applied, its dead letter standing, which a
// redrive would apply twice (TestDeadLetteredJobOfABatchNeverRunsAgain,
// a Reducer and a plain Handler, the owner's connection closed while the
// other job ran). What is left is the window a one-job message has too:
// a crash after the dead letter is stored and before its outcome is kept.
//
// Calls. A Call without a caller's ID, batchable as a Submit is (above),
// goes through its partition's batcher: its reply subject (the client's
// inbox and the Call's token) and its keep-outcome flag travel in the
// batch body, the worker answers it like a one-job Call (grouped replies
// per inbox), and a job of it dead-lettered alone answers its own Call
// with a *RemoteError while the others get their results. When the
// batcher cuts a batch of two jobs or more it seals it (batcher.Config.Seal,
// before any caller can see its job sent): the batch's ID (random, its
// Nats-Msg-Id) is chosen then, and each Call of it gets the job ID
// <batch ID>.<index> (wire.BatchedJobID), which names where its outcome
// is kept (below). A lone job keeps its generated ID. Tested by
// TestCallsTravelInBatches (64 concurrent Calls on one key, then on 64
// keys: batch messages on the wire, every job applied once, every Call
// its own result; without the batched path it saw no batch message) and
// TestBatchedCallOfADeadLetteredJob.
//
// Outcomes. A job with a caller's ID travels in a batch marked
// idempotent: looked up by its ID before it runs, its outcome kept by its
// ID ("One path" above). A batched Call's outcome is kept
// in one results entry per batch, on a namespace whose jobs have held
// outcomes (a Reducer's state entries; an Applier's database) and
// without StoreResults; elsewhere by its job's ID, as a lone Call's (the
// body's keep-outcome flag: one entry per job, before its reply). Where
// per-ID entries stay, and why:
//
//   - StoreResults: Result by ID is promised for every job;
//   - a job with a caller's ID (never batched) and a redrive (never
//     batched): their look-up by ID decides whether they run;
//   - a lone job (a batch of one, its own generated ID): as before;
//   - a plain Handler's batched Calls. A redelivered batch's jobs are
//     looked up by ID (for its dead-lettered ones, above), so a Call kept
//     by ID is answered from it, where one kept in the batch's entry,
//     written only once the whole batch is settled, runs again after a
//     crash. They stay because the batch entry was measured on a
//     Reducer only (the bench's); moving a Handler over is one line
//     (Worker.keptPerBatch), to be measured first.
//
// The entry. Key batch/<batch ID> in the results bucket ('/' is in no
// job ID, so it is no job's key; only a batch whose ID has the generated
// shape, wire.ValidBatchID, has one), TTL'd as every kept outcome
// (ResultsTTL); value wire.EncodeBatchOutcomes, binary and versioned:
// "KLO", version 1, the batch ID, then per Call of the batch, indexes
// strictly ascending, its index, its job ID and its outcome (the kept
// result's encoding), every length a shortest-form uvarint, at most
// wire.MaxBatchJobs outcomes and wire.MaxBatchBytes. The decoder refuses
// anything else with wire.ErrBadOutcomes (fuzzed, with
// wire.ErrNoBatchOutcome for an index a decoded entry lacks:
// FuzzDecodeBatchOutcomes), including a job ID that is not the batch
// ID's and the index's. A reader looks a job up by (batch ID, index) and
// checks the job ID found there against its own (wire.FindBatchOutcome).
// An entry of another batch under the key, another job at the index, or
// a garbled entry (wire.ErrBadOutcomes) is never legit, for only workers
// write the results bucket, and is never another job's outcome: for a
// Call recovering its reply, Client.Result and InspectJob it is a clear
// error; for a worker deciding whether a job runs it is an outcome kept
// but unreadable (so is an outcome in the entry that does not decode):
// the job may have finished, so it is not run again but dead-lettered,
// said at ERROR (permanent: no retry makes the entry readable, and
// retrying would hold the lane), its caller answered with the dead
// letter's error ("kept outcome of job … is unreadable") and that
// outcome kept by its ID, which answers a later retry by ID. An entry of
// the batch without an outcome at the index (wire.ErrNoBatchOutcome) is
// legit (a job of the batch that keeps none in it, or keeps it by ID):
// no outcome for the worker, ErrNoResult for Client.Result and
// InspectJob, and a Call recovering its reply waits on, for its per-ID
// entry or its reply. The results bucket stays writable by workers only
// (docs/security/accounts.conf); clients read the entry with a direct
// get of its key, never by sequence (docs/security.md, "Results read by
// key only").
//
// An entry is bound to the message that earned it. The server
// de-duplicates a batch ID per jobs stream and within its duplicate
// window only, so a batch under an ID already used (on another shard's
// stream, or after the window) is stored, its jobs carrying the first
// batch's job IDs. Its entry overwrote the first batch's, and a retry by
// ID of an honest, dead-lettered job of it got the forger's success
// (TestForgedBatchIDNeverOverwritesItsEntry failed so: "retried call of
// the dead-lettered job … = "n=1", <nil>"). Now the entry carries, in its
// Keylane-Batch-Origin header, the stream, epoch and sequence of the
// batch message whose outcomes it keeps (the value's format, version 1,
// is unchanged, so every reader reads it as before). On receipt, a worker
// that keeps outcomes per batch reads the batch ID's entry from the
// results stream's leader (one get per batch message): an entry of
// another message, or a batch of that ID open on this owner from another
// message, refuses the batch whole before any job of it runs
// (dead-lettered with "batch ID already used by another message", each
// of its Calls answered with that). The entry is then written only over
// the revision read (Nats-Expected-Last-Subject-Sequence, 0: create
// only); a conflict re-reads it, writes over it if it is this message's
// (its earlier write), and otherwise keeps nothing and says so at ERROR,
// never overwriting (a race only a reader of the jobs stream could set
// up: the ID is unguessable before its entry exists). A redelivery of the
// same message finds its own entry and rewrites it
// (TestBatchRewritesItsOwnEntry). An entry written before this release
// names no message: a batch under its ID is refused.
//
// The order. Each job of the batch is answered as soon as it is settled
// (its state written, or dead-lettered alone), its outcome recorded in
// the batch held in memory; once every job of the batch is settled, the
// last one's runner writes the entry (retried with backoff while the
// lease is trusted) and then acks the batch message. A worker that dies
// before the entry is written never acks: the batch is redelivered, its
// jobs are answered from their held outcomes (nothing applied twice),
// and the next owner writes the entry and acks. A Call whose reply is
// lost (replyWait, or a reconnect) waits for the entry: it reads and
// watches both its ID's key and its batch's, so a worker that keeps it
// by ID (above) answers it too. Client.Result reads either.
//
// Retry by ID (promise 7). A Call's *NoReplyError names the job by the
// ID it was sent with; called again WithID that ID, the job goes alone,
// and the worker's look-up by ID reads, for an ID of the batched form,
// the batch this owner still holds open, then the batch's entry (from
// the results stream's leader, as every deciding read): within
// ResultsTTL the job is answered with its outcome, never applied again,
// as a per-ID entry did. A batch that is neither open here nor written
// was redelivered after a crash: its jobs come before the retry in their
// key's lane and are answered from their held outcomes first. The jobs of
// a redelivered batch looked up by ID (with StoreResults, every
// redelivered job is) that miss their per-ID entry read the batch's
// entry once for the batch, not once per job: the first read's answer
// (the entry, or none) is kept on the batch message for its other jobs
// (a failed read is not kept). Only for a batch whose entry this tenure
// never writes (none of its outcomes kept in it here, no batch of its ID
// open here): every outcome in it was then kept by an earlier owner,
// whose lease ended before this tenure began, so the first read cannot go
// stale. Tested by TestRedeliveredBatchReadsItsEntryOnce (a batch of 4
// Calls redelivered to a StoreResults worker: one leader get of its
// entry; before, 4).
//
// Tested by TestBatchedCallRecoversALostReplyFromItsBatchEntry (the
// callers' connection cut while a batch of Calls runs: every Call gets
// its own result once back, from the one batch entry, and no outcome is
// kept by ID but the lone lead's; before, five per-ID entries and no
// batch entry), TestBatchRedeliveredBeforeItsOutcomesWereKept (every
// state of the batch written, then the worker's connection cut before
// the entry, the replies and the ack, the callers' connection cut too:
// the next owner answers every job from its held outcome, nothing applied
// twice, writes the entry, and every Call gets its own result from it),
// TestRetriedBatchedCallIsAnsweredFromItsBatchEntry (retried WithID past
// the key's held window: answered from the entry; without the worker's
// look-up there it was applied twice), TestBatchEntryNeverAnswersAnotherJob
// (a foreign or garbled entry is wire.ErrBadOutcomes for a recovering
// Call), TestGarbledBatchEntryNeverRunsTheJobAgain (a Call retried WithID
// past the held window, its batch's entry cut short: dead-lettered,
// applied once, its caller told why; before, the worker counted the entry
// as no outcome and applied the job twice),
// TestBatchEntryWithoutTheJobIsNoOutcome (an entry lacking the job:
// Result and InspectJob say ErrNoResult, a recovering Call gets the
// outcome kept by its ID later; before, all three failed at once with
// wire.ErrBadOutcomes), TestBatchOutcomesNoneAtIndex (wire) and, as
// before, TestBatchedCallRecoversALostReply.
//
// Dead letters of a batched job are one-job dead letters (its key, type,
// ID in Keylane-Job-Id, allowed headers and payload), so redrive, the
// status page and the dead-letter tools read them as today. Their own ID
// is wire.BatchDeadID (the batch's sequence and the job's index): with
// wire.DeadID alone the second dead letter of one batch would be dropped
// as a duplicate of the first, and its job acked with none stored.
//
// Counting. A batch counts as its jobs: Client.Backlog, Inspect's
// per-partition Pending (keylane status, the status page's backlog) and
// the worker's backlog (Tenure.Backlog, keylane_partition_backlog) add
// to the server's message counts each stored batch message's
// Keylane-Batch-Jobs less one. The server has no headers-only read of a
// stored message, so each batch message is read whole, by a
// next-by-subject get of the batch subjects: Client.Backlog reads the
// stored ones, Inspect each partition's undelivered ones (after the
// consumer's last delivery), at most 256 a stream or partition (the ones
// after count one job each: a lower bound), within one requestTimeout
// (5 s) (with none stored, one request a stream or partition more than
// before). An owner reads its partition's undelivered batch
// messages beside the fetch loop, each once a tenure, at most once a
// second and 256 a read, only while the pending count is above zero
// (internal/tenure, backlog.go): a batch stored since its last read counts one until the
// next. A message without a valid count (malformed, dead-lettered whole)
// counts one. Tested by TestBacklogCountsJobsOfBatches (a batch of 50
// and three jobs: Backlog 53, Pending 53, 52, 51, 1, 0 as the consumer
// delivers them; before, Backlog said 4) and
// TestWorkerBacklogCountsJobsOfBatches (two held jobs ahead of a batch of
// 50 and a job, with MaxInFlight 1: the worker's backlog is 52, then 0).
// Tracing works per job (traceparent travels in each job's headers);
// delays, redrives and admission caps are as today because their jobs go
// alone; repartition refuses a batch routed with another N whole.
//
// Versions. A jobs stream records its format in keylane.version: 4 for
// the one message format, every job in a batch message. A stream of
// version 3 may hold one-job messages of the clients that made it, which
// today's workers refuse (dead-letter unrun), so clients and workers of
// this release refuse to open it, ErrOldJobsStream, with the drain to do:
// drain it with the keylane that made it (its workers running, no
// client sending), then delete it (nats stream rm), or use another
// namespace (docs/upgrading.md; TestOneJobStreamIsRefused, and the
// streams.json vector version-3-one-job-messages, which the Node client
// refuses too). A one-job message that still reaches a stream of version
// 4 (a raw publisher, an earlier client on a namespace set up anew) is
// dead-lettered unrun with its reason and its Call answered with a
// permanent refusal; its dead letter can be redriven, as a batch of one.
// TestMixedVersionClients runs a one-job sender and a batching client at
// once on the same keys (each one-job message dead-lettered, its Call
// refused at once; every batched job once, in its client's order per
// key). The removed
// switch: cmd/keylane's TestBatchesCommandIsGone. A batch dead-lettered
// whole whose body decodes has its Calls answered with the reason
// (TestBatchDeadLetteredWholeAnswersItsCalls). Also tested by
// TestSubmitBatchesAPartitionsConcurrentJobs (64 concurrent Submits of one
// partition: batch messages on the wire, every job run once with its own
// key, payload and header), TestSubmitManyInBatches (cut at 256 jobs,
// every key's order kept) and TestRetryByIDInABatchRunsOnce.
//
// Under faults and hostile input (e2e): TestNemesis, TestKillWorker and
// TestPausedWorker run loads mixing Calls and Submits with and without a
// caller's ID, all in batch messages, checked by the history and trace
// checks; each fails unless batch messages were published and jobs of
// them ran (batchCount.check). The trace names a job by its place in the stream,
// (Seq, Job.Index()): jobs of one batch share Seq, and the checks compare
// both. In TestHostileWire the hostile publisher sends batch messages
// too: broken
// framing (truncated, a length past the end, bytes after the last job, a
// wrong version byte or magic, a count of 0 or over MaxBatchJobs), broken
// headers or subjects (another partition count, another Keylane-Batch
// version, no Keylane-Batch-Jobs or one other than the body's count,
// Keylane-Key on a batch, no batch ID, Keylane-Batch on a one-job
// message, a batch body on a key's subject, a batch subject without
// Keylane-Batch, another partition's batch subject), each dead-lettered
// whole; batches whose every job is refused alone (a key of another
// partition, a control character in the key, ID or type, a reply outside
// the reply prefix, no or a doubled or an unstorable job ID, a reserved
// header) or fails for good (an honest job's ID, keep-outcome without a
// reply), one dead letter per job; and huge ones (past max_payload:
// refused at publish; four jobs filling it; MaxBatchJobs jobs with bad
// keys). No honest outcome changed, no honest job dead-lettered, no key
// stalled.
//
// A batch's job IDs are bound to the batch. The server de-duplicates a
// batch by its own ID only, never a job of it, so a job ID of the
// sender's choosing would claim another caller's job: a job naming an
// honest caller's ID, with the keep-outcome flag, had its outcome kept by
// that ID, and the honest Submit of the ID that followed within the
// duplicate window was stored (a one-job forgery's Nats-Msg-Id would have
// made it ErrDuplicate), returned nil, and was answered from the forged
// outcome without running (TestBatchJobForgingAnHonestID failed so: "the
// honest Submit of victim-1 returned nil, yet stock is 10 after its
// "restock 5" on 10, want 15"; the idempotent flag did the same). Now a
// batch's ID (Nats-Msg-Id) must have the generated shape (wire.ValidBatchID,
// else the message is malformed, dead-lettered whole), every job's ID
// not marked idempotent must be wire.BatchedJobID(batch ID, index) (a
// job marked idempotent carries its caller's ID, since the one wire path,
// and is de-duplicated by the worker by that ID, like a one-job message's
// after the duplicate window: knowing another caller's ID is the
// capability, which is why clients may read outcomes by key only);
// a job that breaks that is refused alone, its dead letter not naming the
// ID it claimed. The client gives every job of a batch that ID when it
// cuts the batch (sealBatch: the batcher's and SubmitMany's alike), so
// Submit and SubmitMany return it. A forger can name only jobs of its own
// batch IDs; claiming an honest batch's would need that batch's ID, a
// random ID it is never sent, and one it reads in the results bucket
// afterwards has an entry bound to another message (above). The test
// now passes (the forged job refused, the
// honest restock applied), and TestHostileWire forges honest IDs
// with and without both flags, and another batch's job IDs.
//
// Cost per job, for a Call without a caller's ID, b jobs per batch and a
// key's group of n (messages through the server, each hop in or out
// counted once; fsyncs with sync_interval: always):
//
//	                                today (one replica)   batches
//	publish, stream ack             2                     2/b
//	delivery                        1                     1/b
//	kept-outcome look-up            2/n                   2/b (the entry's claim)
//	state write                     2/n                   2/n
//	kept outcome put and its ack    2                     2/b
//	reply                           2/n                   2/n (grouped per inbox)
//	ack (and its tombstone)         1                     1/b
//	total                           6 + 6/n               8/b + 4/n
//	fsyncs                          about 1.5             3/b + 1/n
//
// (The entry's claim, a leader get of the batch ID's entry on receipt,
// came with the entry's binding, after the measurements below. It was
// first made on the fetch loop, one round trip per batch message before
// the next was read, which held a hot key's Calls without a caller's ID
// to 0.7 of the path before it. It is now sent on receipt and answered
// beside the fetch loop; the batch's jobs wait in their lanes until it
// answered, so none runs before, and a message of an ID whose claim is
// out waits for that claim before its own is decided, as in order
// (TestForgeryAheadLeavesTheHonestCopyItsEntry). On a one-replica
// results stream it is a direct get, which the one server answers, not
// a JSON API request (internal/kept, entryGet). Hot and skewed Calls
// without a caller's ID went 1.18x and 1.23x faster, to 0.94 and 0.80 of
// the batched path before the one path: docs/speed.md, "The claim".) On
// skewed (n = 1) that is 12 messages today against 4 + 8/b (6 at b =
// 4); on hot (n and b large) almost nothing per job beyond the grouped
// state write and reply. Raw request-reply is 6. The server's CPU per job
// follows its messages (profiled above): about 8 µs per message of
// keylane's today. What is per group is still per job on a catalog (n =
// 1): the next lever is coalescing a partition's concurrent keys' state
// writes into one atomic batch of compare-and-sets, measured before
// built.
//
// Measured after the build (bench command above, --only 'hot,skewed,keylane
// Submit', one run each, the same loaded machine minutes apart; the
// bench's Submit rows give every purchase a caller's ID, which never
// travels in a batch, so KEYLANE_BENCH_SUBMIT_IDS=0 submits without IDs
// and KEYLANE_BENCH_BATCHES=1 turns ClientConfig.Batches and
// WorkerConfig.Batches on):
//
//	Submit, no IDs        batches off                  batches on
//	hot                   29,312/s  16+8+6 µs/job      123,956/s  2+6+3 µs/job
//	skewed                22,312/s  24+14+6            58,448/s   4+9+4
//	hot, fsync always     938/s     237+25+47          85,823/s   4+5+3
//
// (µs/job: server+worker+client CPU.) With IDs, as the default bench,
// nothing is batched and the figures are today's (skewed 8,370 and
// 9,237/s on and off, same CPU per job).
//
// Calls in batches, measured after their build (main f189289 plus the
// calls branch; bench --runs 1 --duration 2s --purchases 20000 --buyers
// 64 --placement separate --only 'hot,skewed,keylane,raw JS' --markdown,
// run twice a minute apart, both with KEYLANE_BENCH_CALL_IDS=0, which
// makes the Call rows call without a caller's ID (the bench's default
// gives each purchase one, and such a Call never travels in a batch), the
// second with KEYLANE_BENCH_BATCHES=1; raw JetStream request-reply from
// the same runs):
//
//	Call, no IDs        batches off                  batches on                  raw request-reply
//	hot                 20,237/s p99 7.2 ms          23,767/s p99 7.0 ms         41,485 and 40,448/s p99 3.4 ms
//	                    38+23+18 = 79 µs/job         26+21+17 = 64               22+5+14 = 41, 24+4+12 = 40
//	skewed              12,712/s p99 12.7 ms         12,282/s p99 13.1 ms        39,524 and 43,782/s p99 3.9, 3.7 ms
//	                    74+46+24 = 144               72+46+32 = 150              24+5+14 = 43, 20+5+13 = 38
//	hot, fsync always   4,572/s p99 20.8 ms          7,990/s p99 12.4 ms         2,112 and 2,061/s
//	                    180+34+28                    84+25+24                    253+66+113, 255+60+111
//
// So on hot the batch pays (+17 %, the server's CPU per job down a
// third; with fsync 1.75×, 3.9× raw request-reply), on skewed it does not
// (about 4 callers per partition at a time: batches are small, and what
// stays per job dominates). What stays per job is, first, each Call's
// kept outcome (a results put and its ack): the same run with the
// keep-outcome flag taken off batched Calls (an experiment, not a
// build: it breaks the lost-reply promise) gave hot 34,815/s p99 5.8 ms,
// 16+14+15 = 45 µs/job (80 % of raw request-reply's 43,677/s in that
// run), skewed 15,655/s, 52+36+28 = 116, hot with fsync 19,477/s. That is
// the room outcomes kept per batch could win, less the cost of one entry
// per batch; a worker's OutcomeBatch of 16 (atomic batches of kept
// outcomes) made batched hot Calls slower (8,946/s), not faster.
//
// Outcomes kept per batch, measured after their build (main 1f0c9f6
// against outcomes a0df8d4; cd bench && KEYLANE_BENCH_BATCHES=1
// KEYLANE_BENCH_CALL_IDS=0 go run . --runs 1 --duration 2s --purchases
// 20000 --buyers 64 --placement separate --only 'hot,skewed,keylane
// Call,raw JS' --markdown, one run each, back to back, on a machine
// shared with other work at a load average of 12, so every figure is
// lower than above; raw JetStream request-reply from the same runs):
//
//	batched Call        per job ID (before)          per batch (after)           raw request-reply (before, after)
//	hot                 12,873/s p99 23.4 ms         18,122/s p99 12.1 ms        20,061 and 22,967/s
//	                    25+22+18 = 65 µs/job         18+20+16 = 54               22+4+14 = 40, 22+4+12 = 38
//	skewed              6,845/s p99 29.1 ms          7,851/s p99 23.9 ms         21,931 and 24,847/s
//	                    79+54+38 = 171               64+46+37 = 147              23+4+14, 21+4+12
//	hot, fsync always   2,590/s p99 184 ms           9,995/s p99 26.2 ms         1,077 and 996/s
//	                    88+31+33                     36+20+23                    218+41+82, 207+25+69
//
// So the entry per batch pays: hot +41 % (64 % of raw request-reply
// before, 79 % after), its p99 halved, the server's CPU per job down
// 28 %; hot with fsync 3.9× (10× raw request-reply with fsync); skewed
// +15 %, where batches are small. Neither target of issue 18 for Calls
// is met yet: hot Call is 79 % of raw request-reply (target 100 %),
// skewed Call 32 %.
package jetstream
