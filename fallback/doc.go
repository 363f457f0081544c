// Package fallback provides locks kept in Redis, for callers that must hold
// a lock around code that cannot move into a keylane handler: what Redisson
// gives Java users, in Go, plus fencing.
//
// # Kinds of lock
//
//   - Locker.Mutex: exclusive. SET key token NX PX ttl to acquire (token: 16
//     bytes from crypto/rand), compare-and-delete to release,
//     compare-and-pexpire to renew. WithOwner makes it reentrant: a hash of
//     owner → count, as Redisson; free only when the count is back to zero.
//   - Locker.FairMutex: waiters acquire in arrival order (a queue list and a
//     zset of waiter timeouts, as Redisson's fair lock). A waiter must poll
//     within Config.FairWaitTimeout or lose its place, so a waiter whose
//     process died blocks the queue at most that long.
//   - Locker.RWMutex: many readers (each with its own lease in a zset) or
//     one writer. Readers do not wait for queued writers: a writer can be
//     starved by overlapping readers.
//   - RedLock: the Redlock algorithm over N independent servers.
//
// Every acquisition returns a *Lock; Do wraps acquire, run, release.
// All Lua lives in scripts/*.lua, embedded with go:embed.
//
// # Waiting
//
// Lock(ctx) blocks until acquired or ctx ends, then returns
// errors.Join(ErrNotAcquired, ctx.Err()); TryLock makes one attempt. Every
// release script PUBLISHes on the key's channel. A Locker shares one pub/sub
// connection among all its waiters, subscribed to a channel while someone
// waits on it; a release wakes the longest waiter (all waiters for fair and
// read-write locks, where the script decides who goes). Under the
// notification is a safety net: the waiter also wakes when the holder's
// PTTL ends or after a jittered backoff doubling from MinBackoff to
// MaxBackoff. Nothing spins at a fixed interval.
//
// # Watchdog and trust window
//
// Without WithLeaseTime, a goroutine owned by the Lock renews it every
// TTL/3 (TTL defaults to 30 s). The holder trusts the lock only until
//
//	sendTimeOfLastSuccessfulRenew + TTL − margin     (monotonic clock)
//
// with margin = TTL*ClockDriftFactor + 2 ms. The send time, not the reply
// time, starts the window, because Redis may have applied the PEXPIRE at
// any moment after the send. A failed renewal is retried after TTL/10; if
// the window closes first, or a renewal reply arrives after it, Done closes
// with ErrExpired; if Redis says the lock is someone else's, with ErrLost.
// The context from Lock.Context (and the one Do hands to fn) is cancelled
// with that cause. Unlock stops and waits for the watchdog before the
// release is sent, so nothing renews after Unlock. Locker.Close abandons
// the locks still held (Redis drops them after their TTL).
//
// A watchdog narrows the window in which a paused holder acts on a lock it
// lost; it cannot close it. The holder can be paused (GC, swap, SIGSTOP)
// between checking Done and touching the resource. Hence fencing.
//
// # Fencing
//
// The acquire scripts INCR a companion key {name}:fence in the same script
// that takes the lock, so every acquisition of a key gets a strictly larger
// number (Lock.Fence). A reentrant re-entry returns the fence of the hold it
// joins. The protected resource must remember the largest fence it accepted
// and refuse any write that does not carry a larger one (see
// ExampleLock_Fence). The fence key has no TTL: one small key per lock
// name, which must survive (persistence) for the numbers to stay monotonic.
//
// # Scripts are never retried blindly
//
// go-redis resends a command after a connection error (MaxRetries defaults
// to 3). A resent EVAL whose first copy ran would apply twice: a reentrant
// count of 2 that never reaches zero, a second fence. New and NewRedLock
// therefore run scripts on a clone of a *redis.Client or *redis.ClusterClient
// with MaxRetries -1 when the given one retries; a client of another type
// must be configured without retries by the caller. The only resend is EVAL
// after a NOSCRIPT reply, which proves EVALSHA did not run. When an acquire
// fails with an unknown outcome (connection cut, ctx cancelled in flight),
// the acquisition is released with its own token; a reentrant acquisition
// under an explicit owner cannot be undone safely (its count may or may not
// have grown) and is left to expire after its TTL, since no watchdog runs
// for it. The plain acquire script is also idempotent per token: a replay
// returns the same fence.
//
// # RedLock: what it does and does not guarantee
//
// RedLock sends the acquire script with one token to N independent servers
// in parallel, each call bounded by NodeTimeout. It holds the lock when at
// least N/2+1 granted it and validity = TTL − elapsed − drift is positive,
// with drift = TTL*0.01 + 2 ms as in the Redlock description. Otherwise it
// releases on every node (also those that did not answer: they may have
// applied it) and returns a *QuorumError joining the per-node errors with
// errors.Join. Renewal and release need a quorum too. It keeps working with
// at most N − (N/2+1) nodes down (2 of 5).
//
// It does not give mutual exclusion in the presence of what Martin
// Kleppmann's critique ("How to do distributed locking", 2016) lists, and
// we agree:
//
//   - Process pauses and network delay: a holder paused past its validity
//     still believes it holds the lock and acts after another holder got it.
//     No timing check inside the client can prevent this.
//   - Clock jumps: Redis expires keys by its wall clock; a server whose clock
//     jumps forward drops a key early, and two quorums can overlap.
//   - Restarts without persistence: a server that restarts empty forgets the
//     keys it granted; it can then grant the same lock to a second client,
//     which completes a quorum while the first still holds (TestRedLock
//     shows it). Use appendfsync always, or keep a restarted server out for
//     longer than the largest TTL ("delayed restarts").
//
// So RedLock is an efficiency lock (it avoids doing work twice most of the
// time), not a correctness lock. For correctness the resource must check
// fencing tokens.
//
// # RedLock fence
//
// A RedLock fence is defined as the maximum of the per-node INCRs over the
// nodes that granted the lock, followed by a second phase that raises every
// granting node's counter to that maximum (fence_raise.lua) before Lock
// returns; if fewer than a quorum are raised, the attempt fails. Any two
// quorums share a node, and that node's counter is at least the previous
// fence, so the next fence is strictly larger: as long as no node loses its
// counter. A node restarted without persistence loses it; the next quorum
// may then draw a fence that is not larger than an earlier one. The
// resource refusing fences that do not increase keeps that safe (the late
// holder is refused; TestRedLock shows it), at the cost of liveness until
// the counters pass the old value. A fence comes from Redis, which is not
// a consensus system: for a fence that is monotonic across any failure,
// take it from a consensus store (etcd revision, ZooKeeper zxid) or from
// keylane's own leases.
//
// # A secured Redis
//
// The package takes a go-redis client, so TLS and credentials are the
// client's: redis.Options{Username, Password, TLSConfig}. docs/fallback.md shows
// a redis.conf with TLS and a least-privilege ACL user (its keys, its
// release channels, and the commands the scripts run), tested as written.
// A refused credential or permission (WRONGPASS, NOAUTH, NOPERM, a command
// a script may not run) is a *RefusedError naming the server and the user;
// Lock returns it at once. A refusal before the script ran leaves nothing
// to undo; a command refused inside a script (RefusedError.InScript) may
// follow writes Redis keeps, so Lock undoes the acquisition then, as for a
// lost reply. Release scripts publish their wake-up with redis.pcall: a
// user without the channel still releases, and waiters fall back to their
// backoff.
//
// # Keys
//
// For a name n and the default prefix: keylane:lock:{n} (the lock),
// keylane:lock:{n}:fence, :queue and :timeouts (fair), :readers (read-write),
// and the channel keylane:lock:{n}:released. The hash tag keeps a lock in
// one Redis Cluster slot. Do not use one name with two kinds of lock.
//
// Logging goes to Config.Logger (quiet by default) with the keys "key" and
// "fence".
package fallback
