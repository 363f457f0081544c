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
// and LimitMarkerTTL set. MaxAge is the lease TTL: the server removes an
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
// kv.Update(key, sameValue, lastRevision): a compare-and-set on the
// revision. Each write is a new message, which restarts the entry's age.
// Nothing else needs to happen on the server.
//
// # Trust window
//
// The holder trusts its lease until
//
//	sendTime(last write known to have landed) + TTL - SafetyMargin
//
// measured on its monotonic clock. The first window starts when the Create
// is sent. Trusted reports it; Done closes with ErrExpired when it passes
// without a successful renew (a timer closes it; Trusted and Err also read
// the clock, so a process resumed from a pause sees "not trusted" on its
// very first check, before its timers have run).
//
// Why the send time: the server stamps the entry when it stores it, which
// is after we sent it. The server expires the entry TTL after that stamp,
// so never before our window (which runs from the earlier send time)
// closes. The reply time would be later than the stamp and would overstate
// the window by the reply's trip.
//
// Why monotonic: the window is a duration on our own clock. Wall-clock
// jumps (NTP steps, a VM resume that sets the time) must not stretch it.
// Go's time.Now carries a monotonic reading and Sub uses it; the lease
// keeps its deadline as an offset from the Create's send time.
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
// revision, the lease was already lost and Release says so (ErrLost).
// Orphan stops renewing without deleting: the entry expires by TTL, as
// after a crash (like etcd's Session.Orphan).
//
// A crashed holder's key is taken over after its entry expires: at most
// TTL (plus the server's expiry slop) after its last renew, which was at
// most RenewEvery before the crash.
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
// # Failure cases
//
//	case                        what happens
//	--------------------------  -------------------------------------------------
//	holder paused past TTL      Its entry expires on the server; a contender takes
//	(GC, SIGSTOP, VM freeze)    the key with a higher fence. On resume, Trusted is
//	                            false and Err is ErrExpired on the first check;
//	                            nothing renews again. Writes it had in flight carry
//	                            the old fence and are refused by the store.
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
//	clock jump                  The holder's window is monotonic, so wall-clock
//	                            steps on the holder do nothing. A forward step
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
// (its watcher is a NATS subscription, stopped before it returns).
package lease
