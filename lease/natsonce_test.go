package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/lease"
)

// A release refused because another writer changed the key says why with
// one "nats:" prefix, as the worker logs it ("partition lease lost"), and
// is still errors.Is ErrLost.
func TestReleaseErrorSaysNatsOnce(t *testing.T) {
	e := newEnv(t, 2*time.Second)
	l := acquire(t, e.kv, "p.0", config(t, "holder"))
	if _, err := e.kv.Put(t.Context(), "p.0", []byte("taken")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := l.Release(ctx)
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("release after another write: %v; want ErrLost", err)
	}
	if strings.Contains(err.Error(), "nats: nats:") {
		t.Fatalf("release error %q says nats: twice", err)
	}
}
