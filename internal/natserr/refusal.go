package natserr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Publishes the server refuses.
//
// A publish to a subject the user may not publish to is dropped by the
// server, which says so only asynchronously: a "-ERR Permissions Violation
// for Publish to …" that nats.go hands to the connection's error handler
// and keeps as its LastError. The ack the caller waits for never comes, so
// without a look at the connection a refused Submit or Call would wait
// until its context ends, and a refused Worker.Start until its first
// JetStream request times out.
//
// The connection is the user's, with the user's handlers: keylane does not
// replace them. It reads nc.LastError() instead, every RefusalCheck while
// an ack is late, and takes a permissions violation that is new since the
// call began (another error value than the one read before publishing)
// and names the call's subject as the call's refusal. The limits: a
// refusal is seen only while it is the connection's last error (another
// error reported in the same instant can hide it, and a reconnect clears
// it; the call then ends as it did before, with its context), and a call
// takes up to one RefusalCheck (Call: its first ack wait) to notice.

// RefusalCheck is how often a late ack looks for the server's refusal.
const RefusalCheck = 200 * time.Millisecond

// APISubjects stands for every subject a worker's start publishes to (the
// JetStream API, $JS.API.…, and KV writes, $KV.…): a refusal of a job
// subject, left on a connection the worker shares with a client, is not
// the start's.
const APISubjects = "$"

// Refusal returns the server's permissions violation for a publish to
// subject ("" for any subject; a subject ending in "." or APISubjects for
// any under it) that nc reported since before (its LastError when the
// call began), or nil.
func Refusal(nc *nats.Conn, before error, subject string) error {
	last := nc.LastError()
	if last == nil || !errors.Is(last, nats.ErrPermissionViolation) || last == before {
		return nil
	}
	what := `Publish to "` + subject
	if !strings.HasSuffix(subject, ".") && subject != APISubjects {
		what += `"`
	}
	if subject != "" && !strings.Contains(last.Error(), what) {
		return nil
	}
	return fmt.Errorf("refused by the server: %w", last)
}

// RefusalWatch returns a context that ends, with the refusal as its
// cause, once the server refuses a publish to subject ("" for any) after
// before, and a function that stops the watch. The watch costs one timer,
// which does not fire while acks come in time.
func RefusalWatch(ctx context.Context, nc *nats.Conn, before error, subject string) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(RefusalCheck, func() {
		if err := Refusal(nc, before, subject); err != nil {
			cancel(err)
			return
		}
		mu.Lock()
		if !stopped {
			t.Reset(RefusalCheck)
		}
		mu.Unlock()
	})
	mu.Unlock()
	return wctx, func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// RefusedCause returns why ctx (a RefusalWatch's) ended if the server's
// refusal ended it, or nil.
func RefusedCause(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, nats.ErrPermissionViolation) {
		return cause
	}
	return nil
}
