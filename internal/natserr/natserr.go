// Package natserr says nats.go's errors with one "nats:" prefix: its
// JetStream API errors read "nats: nats: API error …" when wrapped by the
// KeyValue layer. The cleaned error still unwraps to the original, so
// errors.Is and errors.As see the same chain. Class sorts an error by
// whether trying again may cure it; RefusalWatch notices a publish the
// server refused (a permissions violation, reported only on the
// connection); AckError reads a stream ack that came to an inbox.
package natserr

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Once returns err with a doubled "nats: nats: " prefix said once; other
// errors (and nil) are returned as they are.
func Once(err error) error {
	if err == nil || !strings.HasPrefix(err.Error(), "nats: nats: ") {
		return err
	}
	return &onceError{err}
}

type onceError struct{ err error }

func (e *onceError) Error() string { return strings.TrimPrefix(e.err.Error(), "nats: ") }
func (e *onceError) Unwrap() error { return e.err }

// KeyValue is kv with the errors of its reads and writes said once.
func KeyValue(kv jetstream.KeyValue) jetstream.KeyValue {
	if _, ok := kv.(onceKV); ok || kv == nil {
		return kv
	}
	return onceKV{kv}
}

type onceKV struct{ jetstream.KeyValue }

func (k onceKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := k.KeyValue.Get(ctx, key)
	return e, Once(err)
}

func (k onceKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := k.KeyValue.Create(ctx, key, value, opts...)
	return rev, Once(err)
}

func (k onceKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := k.KeyValue.Update(ctx, key, value, revision)
	return rev, Once(err)
}

func (k onceKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	return Once(k.KeyValue.Delete(ctx, key, opts...))
}
