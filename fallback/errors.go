package fallback

import (
	"errors"
	"fmt"
)

var (
	// ErrNotAcquired reports that a lock was not obtained: TryLock found it
	// held, or Lock gave up because its context ended (then the error also
	// wraps ctx.Err()).
	ErrNotAcquired = errors.New("fallback: lock not acquired")

	// ErrNotHeld reports an Unlock of a lock the caller no longer holds: it
	// expired, was taken over, or was already unlocked. Nothing was deleted.
	ErrNotHeld = errors.New("fallback: lock not held")

	// ErrLost is the cause reported by Lock.Err when a renewal found that
	// the lock belongs to someone else (or to no one) in Redis.
	ErrLost = errors.New("fallback: lock lost")

	// ErrExpired is the cause reported by Lock.Err when the trust window
	// ended before a renewal succeeded, or when a fixed lease ran out.
	ErrExpired = errors.New("fallback: lease expired")

	// ErrUnlocked is the cause reported by Lock.Err after Unlock.
	ErrUnlocked = errors.New("fallback: lock released")

	// ErrClosed reports use of a closed Locker or RedLock, and is the cause
	// reported by Lock.Err for locks abandoned by Close.
	ErrClosed = errors.New("fallback: closed")

	// ErrRefused reports that Redis refused the client's credentials or
	// its user's permissions; see RefusedError.
	ErrRefused = errors.New("fallback: refused by Redis")
)

// RefusedError reports that Redis refused a command for the client's
// credentials (WRONGPASS, NOAUTH) or its ACL user's permissions (NOPERM,
// or a command a script may not run). Nothing ran, and trying again does
// not help until the configuration changes, so a blocked Lock returns it
// at once instead of waiting. It unwraps to ErrRefused and to the Redis
// error.
type RefusedError struct {
	// Addr is the server's address as the client was given it; empty if
	// the client's type does not say.
	Addr string
	// User is the ACL user the client authenticates as; empty for the
	// default user.
	User string
	// Err is the Redis error.
	Err error
	// InScript: a command inside a script was refused; what the script
	// wrote before it stays written (Redis does not roll a script back).
	InScript bool
}

// nothingRan reports an error that proves the script did not run at all
// (refused before it started), so there is nothing to undo.
func nothingRan(err error) bool {
	var re *RefusedError
	return errors.As(err, &re) && !re.InScript
}

func (e *RefusedError) Error() string {
	who := "Redis"
	if e.Addr != "" {
		who += " at " + e.Addr
	}
	user := "the default user"
	if e.User != "" {
		user = fmt.Sprintf("user %q", e.User)
	}
	return fmt.Sprintf("%s refused %s (check the client's Username, Password and the user's ACL): %v", who, user, e.Err)
}

// Unwrap returns ErrRefused and the Redis error.
func (e *RefusedError) Unwrap() []error { return []error{ErrRefused, e.Err} }

// QuorumError reports a RedLock acquisition that did not reach a quorum of
// nodes in time. It unwraps to ErrNotAcquired and to every per-node error.
type QuorumError struct {
	// Acquired is how many nodes granted the lock.
	Acquired int
	// Needed is the quorum, N/2+1.
	Needed int
	// Nodes is N.
	Nodes int
	// Err joins the per-node errors (errors.Join); nil when every node
	// answered and the lock was simply held elsewhere or validity ran out.
	Err error
}

func (e *QuorumError) Error() string {
	msg := fmt.Sprintf("fallback: quorum not reached: %d of %d nodes (need %d)", e.Acquired, e.Nodes, e.Needed)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrNotAcquired and the per-node errors.
func (e *QuorumError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotAcquired}
	}
	return []error{ErrNotAcquired, e.Err}
}

var errReentrantUnsupported = errors.New("fallback: WithOwner is not supported by this lock")
