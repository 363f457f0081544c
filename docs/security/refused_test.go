package security_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRefusedPublishFailsFast: a library call whose publish the server
// refuses (worker-a may read namespace a's jobs stream but not publish
// jobs to it; nor may it start a worker of namespace b) fails within
// seconds, naming the subject and the permissions violation, instead of
// waiting for its context; the user's own error handler still hears of
// it, and nothing is stored.
func TestRefusedPublishFailsFast(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	w, err := startWorker(ctx, wc, "a")
	if err != nil {
		t.Fatalf("worker-a: %v (%v)", err, wc.asyncErrs())
	}
	t.Cleanup(func() { w.Stop(context.Background()) })

	c := connect(t, s, "worker-a", "_INBOX.a")
	cl, err := keylane.NewClient(ctx, c.Conn, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		t.Fatalf("a client over worker-a's connection: %v (%v)", err, c.asyncErrs())
	}
	t.Cleanup(cl.Close)
	// The calls wait out their 30s context otherwise. Half of it, not 4s:
	// beside a CPU hog a SubmitMany was refused after 4.02s and failed
	// the test, which is about not waiting for the context, not a figure.
	const fast = 15 * time.Second
	for _, tc := range []struct {
		name, refused string
		call          func(context.Context) error
	}{
		{"submit", `Publish to "a.jobs.`, func(ctx context.Context) error {
			_, err := cl.Submit(ctx, "k", []byte("forged"))
			return err
		}},
		{"call", `Publish to "a.jobs.`, func(ctx context.Context) error {
			_, err := cl.Call(ctx, "k", []byte("forged"))
			return err
		}},
		{"submit many", `Publish to "a.jobs.`, func(ctx context.Context) error {
			out, err := cl.SubmitMany(ctx, []keylane.Request{{Key: "k", Payload: []byte("forged")}, {Key: "j", Payload: []byte("forged")}})
			if err != nil {
				return err
			}
			if out[0].Err == nil || out[1].Err == nil {
				return fmt.Errorf("stored: %+v", out)
			}
			return out[1].Err
		}},
		{"worker start in another namespace", `Publish to "$JS.API.`, func(ctx context.Context) error {
			// Its own connection: the refusals of the job publishes above
			// may still be arriving on c, and a connection keeps only its
			// last error (refused.go's limit).
			w, err := startWorker(ctx, connect(t, s, "worker-a", "_INBOX.a"), "b")
			if err == nil {
				w.Stop(context.Background())
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			start := time.Now()
			err := tc.call(cctx)
			took := time.Since(start)
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "permissions violation") || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("after %s: %v; want a permissions violation naming %s", took, err, tc.refused)
			}
			if took > fast {
				t.Errorf("refused after %s, want within %s", took, fast)
			}
			t.Logf("refused after %s: %v", took.Round(time.Millisecond), err)
		})
	}
	if !strings.Contains(fmt.Sprint(c.asyncErrs()), `Permissions Violation for Publish to "a.jobs.`) {
		t.Errorf("the user's error handler did not hear of the refusals: %v", c.asyncErrs())
	}
	admin := connect(t, s, "admin", "")
	js, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range natstest.StreamMsgs(t, js, "A_JOBS") {
		if string(m.Data) == "forged" {
			t.Errorf("a refused job was stored: %s", m.Subject)
		}
	}
}
