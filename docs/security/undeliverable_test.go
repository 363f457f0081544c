package security_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestUndeliverableClearedAsWorker: a client of namespace a publishes a
// raw job with an empty payload and a Status header, which nats.go's
// consumer swallows as a server status. The worker, as worker-a under
// accounts.conf, finds it behind the delivery gap, dead-letters it and
// deletes it from the jobs stream (the two reads it needs are in
// WORKER_A), and the partition's later jobs run.
func TestUndeliverableClearedAsWorker(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, wc := startWorkerA(ctx, t, s, 1, keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
		return []byte("ran " + string(job.Payload)), nil
	}), nil)
	cl, cc := clientA(ctx, t, s)
	js, err := jetstream.New(cc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(partition.Subject("a", 0, "k"))
	m.Header.Set(keylane.HeaderKey, "k")
	m.Header.Set(keylane.HeaderJobID, "lookalike")
	m.Header.Set("Status", "100")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if res, err := cl.Call(cctx, "k", []byte("after")); err != nil || string(res) != "ran after" {
		t.Fatalf("a job behind the lookalike: %q, %v (worker: %v)", res, err, wc.asyncErrs())
	}
	admin := connect(t, s, "admin", "")
	ajs, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	testwait.NoError(t, 20*time.Second, "the lookalike dead-lettered", func() error {
		dls, err := keylane.DeadLetters(ctx, ajs, "a", 0, 10)
		if err != nil {
			return err
		}
		if len(dls) != 1 || dls[0].JobID != "lookalike" || !strings.Contains(dls[0].Error, "Status header") {
			return fmt.Errorf("dead letters %+v", dls)
		}
		return nil
	})
}
