// Package balance decides which partitions a worker owns, and starts,
// hands over and aborts their owners. A Balancer is built by Start from a
// Config: the worker's ID, the members and leases buckets, the lease
// settings, and NewOwner, the factory of the worker's owners (Owner: Run,
// HandOver, Abort, Done), so the package knows nothing of what an owner
// does with its partition. Of keylane it imports only lease, partition
// and internal/natserr; the root imports it, never the reverse.
//
// # The assignment
//
// Every balancer computes the same sticky assignment from its view of the
// live members and the lease holders (partition.Assign): each member owns
// floor(N/W) or ceil(N/W) partitions and keeps those it holds up to its
// share, and the rest go by rendezvous hash to members with room. The
// balancer acquires free partitions assigned to it, hands over those it
// owns but are assigned to someone else alive, and takes an orphan
// partition (free for a whole TTL with its assigned owner not claiming
// it). It learns the member set and the lease holders by watching the two
// buckets, and re-checks every TTL/3 as a safety net.
//
// Plain rendezvous hashing (each partition to its highest scored member)
// moves only what must move but is uneven: four workers on 16 partitions
// got 3, 2, 6 and 5. A bounded-load greedy over the member set alone is
// even but cascades: one join shifts partitions between the old members
// too. Taking the current holders as input keeps both: a joining worker
// gets only what the others hold above their new share, and a leaving
// worker's partitions go only to those below theirs. The views of
// different workers lag, and the rule is built so that transients settle
// instead of flapping: a worker hands over only what it holds above its
// share, so a partition it just released, free for a moment in its own
// view, goes to a member with room, never back to it; a worker that saw
// itself alone at start owns everything and gives away its lowest scored
// partitions as others join, which moves each once.
//
// A handler that ignores its context keeps its owner running after the
// lease is lost, and the worker cannot own the partition again until it
// returns. If such a worker stayed the desired owner, the others would take
// the partition as an orphan, hand it back after orphanHold TTLs to a
// worker that cannot take it, and take it again a TTL later: it would
// bounce, free a quarter of the time. So a worker whose owner outlives its
// lease by stuckAfter publishes a stuck mark for the partition in the lease
// bucket (key s.<p>.<worker>, a lease of its own, so it expires with a
// crashed worker), and every balancer bars marked workers from the
// partition when it computes the assignment: they neither keep nor
// receive it, so it goes to a worker that can take it and, held there,
// stays. The mark is released when the owner returns; the partition then
// stays where it is unless the assignment, no longer barred, moves
// something to even the split.
//
// # Failure cases
//
// Each is handled here and shown by a whole-worker test in the root
// package (they need NATS, workers and their handlers):
//
//   - A worker that joins or leaves moves only what must move, and a
//     leaving worker hands its leases over instead of letting them expire
//     (TestBalancingMovesOnlyWhatMust, TestPartitionsSpreadEvenly).
//   - A desired owner that never claims its partitions (a member without a
//     balancer) leaves them free a TTL, then another worker takes them as
//     orphans and keeps them orphanHold TTLs
//     (TestOrphanTakenWhenDesiredOwnerDoesNotClaim).
//   - A worker restarted under its ID waits for its old member entry to
//     expire; a live twin is refused (TestRestartWithSameIDWaitsForOldEntry).
//   - An owner whose handlers outlive its lease publishes a stuck mark
//     (StuckKey), so the partition goes to another worker and stays there
//     (TestStuckHandlerDoesNotBouncePartition).
//   - A bucket watch whose channel closes is watched again with backoff,
//     and balancing pauses until both buckets are re-learnt
//     (TestClosedWatcherIsRecreated); a watch that refuses at Start for a
//     passing reason is tried again until Start's context ends.
//   - A lapsed lease whose delete or expiry the watch never shows is taken
//     again by the stale rule (staleAfter) (TestLapsedLeaseIsTakenAgain,
//     TestNoJobRunsTwiceWithALaggingFollower).
//   - A member entry lost (the process was paused) is registered again.
//
// How this serves the worker, and what owning a partition means on
// JetStream (the consumer re-created, the fence), is written down in
// jetstream/doc.go, "Owning a partition".
package balance
