package lease

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrHeld is returned by Acquire when another holder has the key. The
	// returned error is a *HeldError that names the holder.
	ErrHeld = errors.New("lease: held by another holder")

	// ErrNotAcquired is returned by Campaign when its context ends first,
	// joined with the context's error.
	ErrNotAcquired = errors.New("lease: not acquired")

	// ErrLost ends a lease whose renew found the key changed, deleted or
	// gone: someone else may own it now.
	ErrLost = errors.New("lease: lost")

	// ErrExpired ends a lease whose trust window closed before a renew
	// succeeded.
	ErrExpired = errors.New("lease: trust window closed")

	// ErrReleased ends a lease on which Release (or Orphan) was called.
	ErrReleased = errors.New("lease: released")

	// ErrOrphaned ends a lease on which Orphan was called. It wraps
	// ErrReleased, so errors.Is(err, ErrReleased) holds for it too.
	ErrOrphaned = fmt.Errorf("%w: orphaned", ErrReleased)

	// ErrBucketMismatch is returned when an existing bucket's TTL, history or
	// limit markers differ from what was asked, or a Config's TTL differs
	// from its bucket's.
	ErrBucketMismatch = errors.New("lease: bucket mismatch")

	// ErrFree is returned by Read when nobody holds the key.
	ErrFree = errors.New("lease: free")

	// ErrInvalidConfig is returned for a Config or BucketConfig that cannot
	// work; the message says which field and why.
	ErrInvalidConfig = errors.New("lease: invalid config")
)

// HeldError is the error Acquire returns when the key is taken. It unwraps
// to ErrHeld.
type HeldError struct {
	// Key is the lease key that was asked for.
	Key string
	// Holder is the current holder as stored in the entry; empty when the
	// entry could not be read (for example it went away in the meantime).
	Holder string
	// Revision is the current entry's revision, 0 when unknown.
	Revision uint64
}

func (e *HeldError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("%s: key %q", ErrHeld, e.Key)
	}
	return fmt.Sprintf("%s: key %q held by %q at revision %d", ErrHeld, e.Key, e.Holder, e.Revision)
}

// Unwrap returns ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// isConflict reports whether err is a definite "the key is not at the
// revision you expected" answer from the server, as opposed to an unknown
// outcome (timeout, disconnect). Replicated streams answer with a different
// code (10164) than single-replica ones (10071); both count.
func isConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		errors.Is(err, jetstream.ErrKeyExists) ||
		errors.Is(err, jetstream.ErrKeyNotFound) ||
		errors.Is(err, jetstream.ErrKeyDeleted) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}
