package security_test

import (
	"context"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/nats-io/nats.go/jetstream"
)

// TestClientReadsResultsOnlyByKey: a client of accounts.conf reads the
// results bucket by key only (a direct get of a named key), never by
// sequence (STREAM.MSG.GET, a direct get without a subject) nor through a
// consumer: what it may read never lists other clients' job or batch IDs,
// from which it could work out the next ones or claim an honest batch's
// ID. Before, client-a could walk KV_A_RESULTS by sequence
// ($JS.API.STREAM.MSG.GET.KV_A_RESULTS {"seq":n}) and read every key.
// Its own reads by key still work: a Call retried by ID gets its kept
// outcome, and Result reads it.
func TestClientReadsResultsOnlyByKey(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	w, err := startWorker(ctx, wc, "a")
	if err != nil {
		t.Fatalf("worker-a: %v (%v)", err, wc.asyncErrs())
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	cl, cc := clientA(ctx, t, s)
	first, err := cl.Call(ctx, "k", []byte("x"), keylane.WithID("seen-1"))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cl.Result(ctx, "seen-1"); err != nil || string(res) != string(first) {
		t.Fatalf("Result(seen-1) as client-a = %q, %v; want %q", res, err, first)
	}
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	if again, err := cl.Call(rctx, "k", []byte("x"), keylane.WithID("seen-1")); err != nil || string(again) != string(first) {
		t.Fatalf("Call retried by ID as client-a = %q, %v; want the kept %q", again, err, first)
	}

	for _, tc := range []struct{ name, subject, body string }{
		{"stream get by sequence", "$JS.API.STREAM.MSG.GET.KV_A_RESULTS", `{"seq":1}`},
		{"stream get of the newest entry", "$JS.API.STREAM.MSG.GET.KV_A_RESULTS", `{"last_by_subj":"$KV.A_RESULTS.>"}`},
		{"direct get by sequence", "$JS.API.DIRECT.GET.KV_A_RESULTS", `{"seq":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := connect(t, s, "client-a", "_INBOX.a")
			_, err := c.Request(tc.subject, []byte(tc.body), 300*time.Millisecond)
			refused(t, c, err, `Permissions Violation for Publish to "`+tc.subject+`"`)
		})
	}
	t.Run("consumer on the results stream", func(t *testing.T) {
		c := connect(t, s, "client-a", "_INBOX.a")
		js, _ := jetstream.New(c.Conn)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := js.OrderedConsumer(cctx, "KV_A_RESULTS", jetstream.OrderedConsumerConfig{})
		if err == nil {
			// (An ordered consumer is created on its first fetch.)
			_, err = js.CreateConsumer(cctx, "KV_A_RESULTS", jetstream.ConsumerConfig{Name: "lister"})
		}
		refused(t, c, err, `Permissions Violation for Publish to "$JS.API.CONSUMER.`)
	})
	t.Run("direct get of a named key asking for a sequence", func(t *testing.T) {
		// The key's form takes no sequence: the server answers 408.
		m, err := cc.Request("$JS.API.DIRECT.GET.KV_A_RESULTS.$KV.A_RESULTS.seen-1", []byte(`{"seq":1}`), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if st := m.Header.Get("Status"); st != "408" || len(m.Data) != 0 {
			t.Fatalf("answer %q %q; want status 408 and nothing", st, m.Data)
		}
	})
	if err := wc.asyncErrs(); err != nil {
		t.Fatalf("worker-a met refusals: %v", err)
	}
}
