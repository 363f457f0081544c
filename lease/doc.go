// Package lease gives one holder at a time a key in a NATS KV bucket, with a
// trust window the holder checks before acting, and a fencing token per
// tenure.
//
// Leases are a liveness optimisation, not a correctness guarantee. They
// make it rare for two holders to act at once, and they let a successor
// take over quickly. Correctness comes from the fencing token: every write
// that a lease protects carries Fence(), and the store that takes the write
// refuses a fence lower than the highest it has seen. A holder that was
// paused, partitioned or fooled by a clock can then only fail, never
// overwrite its successor's work.
//
// # The bucket
//
// EnsureBucket makes a KV bucket (a stream) with MaxAge = TTL, History 1,
// and LimitMarkerTTL set, and a first revision taken from the wall clock
// (see Fencing). MaxAge is the lease TTL: the server removes an
// entry TTL after its last write. With limit markers on, the server then
// writes a marker (header Nats-Marker-Reason: MaxAge, a subject rollup) in
// its place, which watchers see as a KeyValuePurge operation: expiry is an
// event, like a delete. Leases never use per-key TTLs (KeyTTL): Update
// does not carry one, so a renewed key would never expire again.
//
// # Acquire
//
// Acquire is kv.Create(key, {holder, nonce, acquiredAt}). Create only
// succeeds if the key has no value (never written, deleted, purged or
// expired). The revision it returns is the fence of the tenure. The nonce
// is random per tenure and lets the holder recognise its own writes when
// an outcome was unknown (below). If the key is taken, Acquire returns a
// *HeldError naming the holder.
//
// Campaign waits for a key: it starts a watcher on it (UpdatesOnly, so
// starting it is cheap), then tries Create, and after a failure waits for
// the watcher to show a delete, purge or expiry marker, or for one TTL as a
// safety net against a missed event, and tries again. The watcher starts
// before the first try, so a release between a failed Create and the wait
// is not missed.
//
// # Renew
//
// A watchdog goroutine renews every RenewEvery (default TTL/3) with
// kv.Update(key, value, lastRevision): a compare-and-set on the revision.
// Each write is a new message, which restarts the entry's age. Nothing
// else needs to happen on the server. The renews' value is the Create's
// plus the fence ({…, fence}), which the Create could not name: a reader
// of the entry (Read, keylane status) learns the tenure's fence, not the
// latest renew's revision.
//
// # Trust window
//
// The holder trusts its lease until
//
//	sendTime(last write known to have landed) + TTL - SafetyMargin
//
// measured on the boot clock (below). The first window starts when the
// Create is sent. Trusted reports it; Done closes with ErrExpired when it
// passes without a successful renew (a timer closes it; Trusted and Err
// also read the clock, so a process resumed from a pause or a suspend sees
// "not trusted" on its very first check, before its timers have run).
//
// Why the send time: the server stamps the entry when it stores it, which
// is after we sent it. The server expires the entry TTL after that stamp,
// so never before our window (which runs from the earlier send time)
// closes. The reply time would be later than the stamp and would overstate
// the window by the reply's trip.
//
// Why the boot clock: the window is a duration on our own clock. Wall-clock
// jumps (NTP steps, a VM resume that sets the time) must not stretch it,
// and neither may time the system spent suspended. Go's monotonic clock
// (the reading in time.Now that Sub and Since use) is immune to the first
// but not the second: on Linux it is CLOCK_MONOTONIC, which stops while the
// system is suspended, so after a resume it would trust a lease that
// expired during the suspend. The lease reads CLOCK_BOOTTIME instead
// (clock_linux.go, through golang.org/x/sys/unix): CLOCK_MONOTONIC plus the
// time spent suspended, never set, never stepped. Send times and the
// deadline are readings of it. On other systems it falls back to Go's
// monotonic clock (clock_other.go); on macOS that is mach_absolute_time,
// which stops during sleep too, so there a suspend is not covered. A read
// is a system call, not a vDSO call: about 1.9µs against 35ns for Go's
// monotonic clock on a Firecracker VM with PTI
// (go test -run XXX -bench Clock ./lease/), paid by each Trusted and Err.
//
// Why the margin (default TTL/10): the server measures TTL on its clock
// and we on ours. The margin covers rate drift between the two clocks over
// one TTL and scheduling delays on our side (between reading the clock and
// acting). The server's expiry timer errs late, never early: it checks ages
// against a coarse clock that lags real time by up to 100ms and re-checks at
// least 250ms apart, so in practice an entry goes about 250ms after its
// TTL (a take-over after a crash takes TTL + ~250ms; see the tests).
//
// A renew is only counted if its reply arrives before the current
// deadline. Later than that, the write may have reached the server after
// the server had decided the previous entry expired; the expiry marker is a
// rollup that would then erase it. Each renew request is therefore bounded
// by the time left until the deadline (and by one period, so a request lost
// in a reconnect is retried).
//
// # Pauses and suspends
//
// Protected: a holder that does not run for longer than its window, and
// then resumes, does not act on its lease again. That covers a stopped
// process (GC, SIGSTOP, a debugger, an overloaded host) and a suspended
// system (suspend to RAM or to disk by the holder's kernel, a laptop's
// lid): the boot clock counts both, so the first Trusted or Err after the
// resume sees the window closed and ends the lease with ErrExpired. The
// watchdog checks the boot clock at every wake-up and after every reply, so
// it ends the lease within one RenewEvery of the resume even if nobody
// asks, and a renew whose reply arrives after the deadline (the system was
// suspended while it was in flight) is not counted.
//
// Not protected by the clock, so left to the fence:
//
//   - A pause after the check. Trusted said yes, then the process stopped,
//     and the write it was about to send arrives after a successor took
//     the key. No check on the holder can see this; the store refuses the
//     write's old fence once the successor has written.
//   - Late timers. Go's timers and context deadlines run on
//     CLOCK_MONOTONIC, so after a suspend they fire late: Done closes up
//     to one RenewEvery after the resume rather than at the deadline, and a
//     renew in flight over the suspend is not cut off at the deadline. The
//     boot clock check above catches both, but code that only watches Done
//     and never calls Trusted can act on an expired lease in between.
//   - A pause the guest does not see. A hypervisor that pauses a VM (KVM
//     stop and continue, snapshot and restore, some live migrations)
//     typically restores the guest's clock where it stopped: then neither
//     clock counts the pause, the holder resumes with the rest of its old
//     window, and trusts it until its next renew fails (ErrLost, within one
//     RenewEvery) or the window ends.
//   - A boot clock that jumps or runs wrong (an unstable clock source, a
//     VM moved to a host whose TSC differs). Rate drift up to SafetyMargin
//     is covered; a jump is not.
//   - The server's clock. The server expires entries by its own wall
//     clock; a forward step there expires entries early (see the table
//     below), and nothing on the holder can notice before its next renew.
//   - Systems other than Linux, where the window is on Go's monotonic
//     clock (above).
//
// # What a timeout means
//
// A timeout, a disconnect or "no responders" is an unknown outcome, never
// "lost" (or, for a Create, "won"). The watchdog keeps retrying with a
// short backoff until the deadline, with the same expected revision. If the
// earlier attempt did land, the retry gets a revision mismatch; the
// watchdog then reads the entry, and if it carries this tenure's nonce it
// adopts that revision, with the send time of the first unknown attempt as
// the start of the new window (the write that landed was sent no earlier).
// Only this tenure writes its nonce, so this is safe. An unknown Create is
// read back the same way.
//
// The read is a KV get, which on a replicated bucket with direct gets
// (every bucket EnsureBucket makes) any replica answers from what it has
// applied, so it may be stale. The only wrong answer it could give is
// this tenure's entry at the revision the retry expected, or an older
// one, when a renew did land after it, or someone took the key since:
// the mismatch proves the entry moved past that revision, so the
// watchdog adopts only a revision past it and treats ours-at-or-before
// as still unknown (Release reads again, below). A stale "not ours" ends the
// lease early, the safe direction; a stale "ours" after an unknown Create
// is not stale at all (only a Create that landed writes that nonce).
//
// # Loss
//
// A revision mismatch, "not found" or "deleted" on a renew, with every
// earlier write accounted for, means the entry changed under us: someone
// deleted it, overwrote it, or it expired and was taken. The lease ends at
// once with ErrLost. It is noticed at the next renew, so within one
// RenewEvery.
//
// # Release and take-over
//
// Release stops the watchdog (and waits for it), closes Done, then
// deletes with kv.Delete(key, LastRevision(rev)): a compare-and-delete that
// cannot remove a successor's entry. Watchers see the delete and Create at
// once, typically within a few milliseconds. If the delete finds another
// revision, a renew cut short by the stop (or an earlier delete whose
// outcome was unknown) may have landed: Release reads the entry back. Ours
// at a newer revision is deleted at that one; ours at the old revision or
// before is a replica behind, and Release reads again, with a short
// backoff, until a replica shows the newer write or its context ends (then
// the outcome is unknown, the error says the replicas stayed behind, and a
// later call tries again; TestReleaseRereadsAStaleReplica). Not ours: the
// lease was already lost and Release says so (ErrLost).
// Orphan stops renewing without deleting: the entry expires by TTL, as
// after a crash (like etcd's Session.Orphan).
//
// A crashed holder's key is taken over after its entry expires: at most
// TTL (plus the server's expiry slop) after its last renew, which was at
// most RenewEvery before the crash.
//
// # The lease as a context
//
// Done and Err show the end of a lease; Context(parent) carries it into
// code that takes a context, as fallback.Lock.Context does for a Redis
// lock. The context is derived from parent and cancelled soon after Done
// closes (a context.AfterFunc on the lease's life, so at once after
// Release or Orphan, within one RenewEvery of a loss, at the trust deadline
// on expiry); context.Cause then returns the same error as Err, wrapping
// ErrLost, ErrExpired, ErrReleased or ErrOrphaned. A context asked of an
// ended lease is cancelled on return. Cancelling the context (its cancel,
// or its parent) does not end the lease. It ends when Done closes, so it
// inherits Done's limits above: after a suspend it may end up to one
// RenewEvery late. Acting still wants Trusted first, and the fence.
//
// # Fencing
//
// The fence is the revision of the tenure's Create. Revisions are stream
// sequences: one counter for the whole bucket, which only grows (the file
// store keeps the last sequence across restarts even when the stream is
// empty). A later tenure's Create comes after the earlier tenure's last
// write, so its fence is strictly greater. Renews change the revision
// (Revision) but not the fence: the fence names the tenure, not the write.
//
// Fences also grow across buckets. A bucket deleted and made again (an
// operator's mistake, a rebuild) would start its sequence at 1 again, below
// fences the old bucket handed out and that stores still keep next to
// per-key state: they would refuse every write of the new owners. So when
// EnsureBucket creates a bucket, it creates the stream itself, as nats.go
// would for the KV bucket, plus FirstSeq = the wall clock in microseconds
// since the Unix epoch (nats.go's KeyValueConfig has no FirstSeq). A lease
// bucket takes far fewer than one write per microsecond, so every revision
// of a bucket stays below the creation time of any later one: a fence from
// a newer bucket is always greater than every fence from an older one.
// This assumes the creating host's wall clock did not go back, between the
// two creations, by more than the time from the old bucket's last write to
// the new bucket's creation; and that the old bucket averaged under one
// write per microsecond over its life. Fences stay below 2^53 (exact in a
// float64) until the year 2255. Concurrent creators each ask for their own
// FirstSeq; the server makes the stream once and refuses the others (name
// in use), which then open that one.
//
// Not covered: a bucket created by something other than EnsureBucket (the
// nats CLI, nats.go's CreateKeyValue, a bucket made before this scheme;
// EnsureBucket opens those as they are), and a bucket restored from a
// backup, whose sequence resumes where the backup was taken, below fences
// handed out since. Purging the stream with a sequence after creation would
// lift the floor too but race with the first Creates and delete live
// leases, so it is not used.
//
// # Failure cases
//
//	case                        what happens
//	--------------------------  -------------------------------------------------
//	holder paused past TTL      Its entry expires on the server; a contender takes
//	(GC, SIGSTOP, system        the key with a higher fence. On resume, Trusted is
//	suspend on Linux)           false and Err is ErrExpired on the first check
//	                            (the boot clock counts the pause); nothing renews
//	                            again. Writes it had in flight carry the old fence
//	                            and are refused by the store.
//	VM paused by hypervisor,    Neither guest clock may count the pause: the
//	suspend outside Linux       holder trusts the rest of its old window until its
//	                            next renew finds the key changed (ErrLost). Two
//	                            holders may overlap; fencing covers this.
//	network partition           Renews time out: unknown outcome, retried until
//	(holder cut off)            the deadline, then ErrExpired. The server expires
//	                            the entry at least SafetyMargin later; only then
//	                            can a contender take it.
//	server restart (file        Renews fail (no responders, timeouts) and are
//	store)                      retried. Back within the window: the same CAS
//	                            lands and nothing changed. Later: the holder
//	                            expires; the entry expires on the restarted
//	                            server and gets its marker; watchers resubscribe,
//	                            and Campaign also retries every TTL.
//	clock jump                  The holder's window is on the boot clock, so
//	                            wall-clock steps on the holder do nothing. A forward step
//	                            of the server's wall clock expires entries early:
//	                            two holders may overlap until the old one's next
//	                            renew fails (ErrLost). Fencing covers this.
//	clock rate drift            Covered by SafetyMargin (TTL/10 by default, far
//	                            above real drift rates).
//	renew lost in flight        Unknown outcome, retried; the retry's mismatch is
//	(reply dropped)             resolved by reading back the nonce (see above).
//	renew request lost          Unknown outcome, retried with the same revision.
//	key deleted or overwritten  ErrLost at the next renew; Release then refuses
//	behind the holder's back    to touch the other entry.
//
// # Goroutines
//
// Each Lease owns one goroutine, its watchdog; it exits when the lease
// ends, and Release and Orphan wait for it. Campaign starts none of its own
// (its watcher is a NATS subscription, stopped before it returns). Context
// starts none either: when the lease ends, context.AfterFunc runs one short
// goroutine per live context to cancel it, and the context's cancel
// unhooks it from the lease.
package lease
