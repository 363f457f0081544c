package security_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDelayedJobsAsAccounts: under accounts.conf a worker of a namespace
// with delays moves a client's delayed job into the delays stream, runs it
// when due and deletes its due copy; client-a may submit delayed jobs but
// cannot publish to the delays stream's subjects (schedules, due copies),
// so it can neither forge a due copy nor purge a waiting schedule.
func TestDelayedJobsAsAccounts(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ran := make(chan string, 4)
	h := keylane.HandlerFunc(func(_ context.Context, j keylane.Job) ([]byte, error) {
		ran <- j.ID
		return []byte("ok"), nil
	})
	_, wc := startWorkerA(ctx, t, s, 2, h, func(c *keylane.WorkerConfig) { c.Topology.Delays = true })
	cl, cc := clientA(ctx, t, s)
	if _, err := cl.Submit(ctx, "seat:1", []byte("release"), keylane.WithID("hold-1"), keylane.WithDelay(500*time.Millisecond)); err != nil {
		t.Fatalf("client-a's delayed job: %v", err)
	}
	select {
	case id := <-ran:
		if id != "hold-1" {
			t.Fatalf("ran %q", id)
		}
	case <-ctx.Done():
		t.Fatalf("the delayed job never ran (worker-a: %v)", wc.asyncErrs())
	}
	admin := connect(t, s, "admin", "")
	ajs, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 20*time.Second, "the delays stream empty (schedule fired, due copy deleted)", func() bool {
		st, err := ajs.Stream(ctx, "A_DELAYS")
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	p := partition.Of("seat:1", 2)
	for _, subject := range []string{partition.ScheduleSubject("a", p, "hold-2"), partition.DueSubject("a", p, "seat:1")} {
		m := nats.NewMsg(subject)
		m.Header.Set(keylane.HeaderDelayedID, "victim")
		m.Header.Set(keylane.HeaderKey, "seat:1")
		err := cc.PublishMsg(m)
		if err == nil {
			err = cc.Flush()
		}
		testwait.Eventually(t, 5*time.Second, "a permissions violation for "+subject, func() bool {
			return errors.Is(cc.asyncErrs(), nats.ErrPermissionViolation) || errors.Is(err, nats.ErrPermissionViolation)
		})
	}
	if err := wc.asyncErrs(); err != nil {
		t.Fatalf("worker-a was refused something: %v", err)
	}
}
