// Package jetstream is keylane on NATS JetStream: the namespace's streams
// and buckets, the client that submits jobs, the worker that owns
// partitions and runs them, and State for per-key state with exactly-once
// effect. Most users reach it through the root package keylane.
//
// # Topology
//
// Setup creates, idempotently, for a namespace ns (default "keylane"):
//
//	NS_JOBS     stream, subjects ns.jobs.<p>, WorkQueue retention, file storage,
//	            duplicate window ≥ 2m; metadata keylane.partitions=N, keylane.hash
//	NS_DEAD     stream, subjects ns.dead.<p>: failed and malformed jobs
//	NS_LEASES   KV, key p.<p>: partition leases (TTL = lease TTL, History 1)
//	NS_MEMBERS  KV, key = worker ID: live workers (same TTL mechanism)
//	NS_RESULTS  KV, key = job ID: results, when workers store them
//	NS_STATE    KV, key = k.<base64url(resource key)>: State entries
//
// Every client and worker reads N and the hash from the stream's metadata
// and refuses a mismatch (ErrPartitionMismatch): a job routed with another N
// would reach the wrong owner and break per-key exclusion.
//
// # Submitting
//
// Client.Submit validates the key (package partition), the job ID and the
// size, then publishes to ns.jobs.<xxhash(key) mod N> with the key in the
// Keylane-Key header and the job ID in Nats-Msg-Id, and returns when the
// stream has stored it. Call adds a Keylane-Reply header naming a
// per-client inbox and waits for the worker's reply. SubmitMany publishes
// asynchronously with a bounded window.
//
// # Owning a partition
//
// A worker registers in NS_MEMBERS (a lease on its ID) and watches both KV
// buckets. The desired owner of partition p is the live member with the
// highest rendezvous hash of (p, member). The balancer acquires a free
// partition it is desired for at once, and any partition left free for a
// whole TTL (its desired owner is not claiming it); it hands over
// partitions whose desired owner is someone else alive.
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
// # Running jobs
//
// One fetch loop per owned partition pulls batches (at most MaxInFlight
// unacked) and hands each job to its key's lane. A lane runs one job at a
// time in stream order; a fixed pool of Concurrency runners serves the
// lanes, so different keys of a partition run in parallel and no goroutine
// is started per job. A hot key yields its runner after a burst when other
// lanes wait.
//
// A failing job is retried in place with backoff, so later jobs of its key
// wait behind it while other keys flow; after MaxDeliver attempts, or at
// once for a Permanent error, it goes to NS_DEAD with Keylane-Error,
// Keylane-Attempts and Keylane-Worker headers and is acked. Messages that
// are not valid jobs (no key, a key of another partition) are dead-lettered
// as "malformed" and never reach the handler. Jobs waiting or running
// longer than AckWait/3 get InProgress so the server does not redeliver
// them.
//
// After the handler returns, the owner stores the result (optional),
// replies, and acks, and does each only while Lease.Trusted(): a worker
// whose trust window has closed neither replies nor acks. Lease loss
// cancels the handlers' context and drops queued jobs; the next owner gets
// them again.
//
// # Stopping
//
// Stop leaves the member set, stops fetching (draining the fetch buffer
// into the lanes), lets every fetched job finish and be acked, waits until
// the server has no ack pending, and releases the leases with
// compare-and-delete. Successors watching the lease bucket acquire at once:
// a graceful hand-over takes milliseconds and runs no job twice.
//
// # Exactly-once effect
//
// State.Apply stores a key's value with compare-and-set on the KV revision,
// together with the writing job's stream sequence, fence and result. A job
// whose sequence is not above the stored one was applied before: its stored
// result is returned. A job whose fence is below the stored one comes from
// a deposed owner: ErrStaleFence, nothing written, and the owner steps
// down. See package lease for why fences, not leases, carry correctness.
//
// # Group commit
//
// A worker with a Reducer writes a key's state once per group of jobs, not
// once per job. A lane runner takes up to 256 queued jobs of one key,
// reduces them in stream order on the cached state, and stores the outcome
// with one compare-and-set: the value, the last job's sequence, the fence
// and every grouped job's result (StateEntry.Earlier). Only after that
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
//     the group's sequences at or below the stored one and answers them
//     from StateEntry.Earlier without running them.
//   - A newer owner wrote the key: the CAS fails or the stored fence is
//     higher; the group is dropped and this owner steps down.
//
// # Client group commit
//
// With ClientConfig.GroupCommit, concurrent Calls and Submits queue while a
// few atomic batches are in flight and go out together as one JetStream
// atomic batch, which a server with sync_interval: always stores with one
// fsync. A refused or unacknowledged batch is resent job by job; the job
// IDs (Nats-Msg-Id) make that safe.
package jetstream
