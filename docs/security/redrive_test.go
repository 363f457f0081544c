package security_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestOnlyOperatorsRedrive: a client of namespace a that names another
// job in Keylane-Redrive-Of (a raw publish with the header, and Submit
// with WithHeader) changes nothing of that job: the victim's kept outcome
// stays its own, and the victim's later order is applied, not answered
// from a forged outcome. A client cannot write the redrive ticket that
// makes a redrive count (Client.Redrive as client-a is refused and
// submits nothing); the admin's Client.Redrive works, its outcome kept
// under the original ID.
func TestOnlyOperatorsRedrive(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	applied := map[string]int{} // payloads the handler ran
	var broken atomic.Bool
	_, wc := startWorkerA(ctx, t, s, 4, keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
		if broken.Load() && string(job.Payload) == "fail" {
			return nil, keylane.Permanent(errors.New("card declined"))
		}
		mu.Lock()
		applied[string(job.Payload)]++
		mu.Unlock()
		return []byte("applied " + string(job.Payload)), nil
	}), func(c *keylane.WorkerConfig) { c.Backoff = func(int) time.Duration { return 10 * time.Millisecond } })
	cl, cc := clientA(ctx, t, s)

	if res, err := cl.Call(ctx, "acct:1", []byte("v1"), keylane.WithID("victim-1")); err != nil || string(res) != "applied v1" {
		t.Fatalf("the victim's first order: %q, %v", res, err)
	}

	// The forgers: one raw publish with the header, one through Submit
	// (which may refuse the header at the client: that is fine too).
	js, err := jetstream.New(cc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	// The raw one is a batch of one, as a redrive travels (a one-job
	// message is refused unrun whatever it carries).
	body, err := wire.EncodeBatch([]wire.BatchJob{{Key: "evil", ID: "forge-1", Idempotent: true, Payload: []byte("forged-1")}})
	if err != nil {
		t.Fatal(err)
	}
	forged := &nats.Msg{Subject: wire.BatchSubject("a", partition.Of("evil", 4)), Data: body, Header: nats.Header{
		keylane.HeaderJobID: {"forgedRedriveBatch0001"}, wire.HeaderBatch: {"1"}, wire.HeaderBatchJobs: {"1"},
		keylane.HeaderPartitions: {"4"}, keylane.HeaderRedriveOf: {"victim-1"},
	}}
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatalf("the raw forger's publish: %v", err)
	}
	forgers := []string{"forge-1"}
	if _, err := cl.Submit(ctx, "evil", []byte("forged-2"), keylane.WithID("forge-2"), keylane.WithHeader(keylane.HeaderRedriveOf, "victim-2")); err == nil {
		forgers = append(forgers, "forge-2")
	}
	for _, id := range forgers {
		testwait.Eventually(t, 20*time.Second, id+" ran and its outcome is kept", func() bool {
			res, err := cl.Result(ctx, id)
			return err == nil && strings.HasPrefix(string(res), "applied forged")
		})
	}
	if res, err := cl.Result(ctx, "victim-1"); err != nil || string(res) != "applied v1" {
		t.Fatalf("the victim's kept outcome after a forged Keylane-Redrive-Of: %q, %v; want its own %q", res, err, "applied v1")
	}
	if res, err := cl.Call(ctx, "acct:1", []byte("v2"), keylane.WithID("victim-2")); err != nil || string(res) != "applied v2" {
		t.Fatalf("the victim's next order: %q, %v; want it applied", res, err)
	}
	mu.Lock()
	if applied["v2"] != 1 {
		t.Fatalf("the victim's next order ran %d times, want once", applied["v2"])
	}
	mu.Unlock()

	// A real redrive: client-a cannot write its ticket, the admin can.
	broken.Store(true)
	if _, err := cl.Call(ctx, "acct:2", []byte("fail"), keylane.WithID("order-9")); err == nil {
		t.Fatal("the failing order succeeded")
	}
	admin := connect(t, s, "admin", "")
	ajs, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	var dls []keylane.DeadLetter
	testwait.Eventually(t, 20*time.Second, "one dead letter", func() bool {
		dls, err = keylane.DeadLetters(ctx, ajs, "a", 0, 10)
		return err == nil && len(dls) == 1
	})
	broken.Store(false)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = cl.Redrive(rctx, dls[0])
	rcancel()
	if err == nil {
		t.Fatal("client-a redrove a dead letter: it wrote a redrive ticket")
	}
	refused(t, cc, err, `Permissions Violation for Publish to "$KV.A_RESULTS.redrive/`)
	mu.Lock()
	if applied["fail"] != 0 {
		t.Fatalf("client-a's refused redrive ran the job %d times", applied["fail"])
	}
	mu.Unlock()
	acl, err := keylane.NewClient(ctx, admin.Conn, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(acl.Close)
	id, err := acl.Redrive(ctx, dls[0])
	if err != nil {
		t.Fatalf("the admin's redrive: %v", err)
	}
	testwait.Eventually(t, 20*time.Second, "the original ID answers with the redriven outcome", func() bool {
		res, err := cl.Result(ctx, "order-9")
		return err == nil && string(res) == "applied fail"
	})
	if res, err := cl.Result(ctx, id); err != nil || string(res) != "applied fail" {
		t.Fatalf("Result of the redriven job %s: %q, %v", id, res, err)
	}
	if err := wc.asyncErrs(); err != nil {
		t.Fatalf("worker-a met refusals: %v", err)
	}
}
