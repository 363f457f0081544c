package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go/jetstream"
)

// casTries bounds the attempts of one compare-and-set loop: each conflict
// means another writer got in first, and a key contended that often has a
// writer that should not be there.
const casTries = 9

// ErrTooManyWriters is why a compare-and-set loop gave up.
var ErrTooManyWriters = errors.New("too many concurrent writers")

// Put is the one compare-and-set write of keylane's KV entries (State
// entries, the crash-loop counter): it creates k if rev is 0 and updates it
// from revision rev otherwise, and returns the new revision. A refusal
// says "nats:" once (nats.go's KV puts its own before the API error's).
func Put(ctx context.Context, kv jetstream.KeyValue, k string, rev uint64, value []byte) (next uint64, err error) {
	if rev == 0 {
		next, err = kv.Create(ctx, k, value)
	} else {
		next, err = kv.Update(ctx, k, value, rev)
	}
	return next, natserr.Once(err)
}

// Conflict reports whether a Put failed because another writer
// changed the key first.
func Conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// Loop runs attempt (read, decide, Put) until it ends without a
// conflict, at most casTries times; reread tells an attempt that the one
// before it lost to another writer, so a cached read is stale.
func Loop(ctx context.Context, attempt func(reread bool) error) error {
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := attempt(i > 0)
		if !Conflict(err) {
			return err
		}
		if i+1 == casTries {
			return fmt.Errorf("%w: %w", ErrTooManyWriters, err)
		}
	}
}
