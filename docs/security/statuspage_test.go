package security_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go/jetstream"
)

// The status page a worker serves on --metrics reads as the worker's
// user: worker-a's page of namespace a shows its owner and its dead
// letter; a page of namespace b over worker-a's connection is an error
// page within its Timeout that names the permissions violation, not a
// hang and not b's data.
func TestStatusPageAsWorker(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := connect(t, s, "worker-a", "_INBOX.a")
	w, err := keylane.NewWorker(wc.Conn, keylane.WorkerConfig{
		ID:       "worker-a-1",
		Topology: keylane.TopologyConfig{Namespace: "a", Partitions: 2, ReplyPrefix: "_INBOX.a."},
		Handler: keylane.HandlerFunc(func(context.Context, keylane.Job) ([]byte, error) {
			return nil, keylane.Permanent(errors.New("declined"))
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatalf("worker-a: %v (%v)", err, wc.asyncErrs())
	}
	t.Cleanup(func() { w.Stop(context.Background()) })
	cc := connect(t, s, "client-a", "_INBOX.a")
	cl, err := keylane.NewClient(ctx, cc.Conn, keylane.ClientConfig{Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := cl.Call(ctx, "k", []byte("x"), keylane.WithID("order-1")); err == nil {
		t.Fatal("the declined job succeeded")
	}

	js, err := jetstream.New(wc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	page := func(ns string, query ...string) (int, statuspage.Page) {
		t.Helper()
		h, err := statuspage.Handler(js, statuspage.Config{Namespace: ns, Worker: w.ID(), Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(h)
		defer hs.Close()
		resp, err := hs.Client().Get(hs.URL + "/status.json" + strings.Join(query, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var p statuspage.Page
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("status.json of %s: %v\n%s", ns, err, b)
		}
		return resp.StatusCode, p
	}
	code, p := page("a")
	if code != http.StatusOK || p.Error != "" || p.Status == nil || len(p.DeadLetters) != 1 || p.DeadLetters[0].JobID != "order-1" {
		t.Fatalf("worker-a's page of namespace a: %d %+v (%v)", code, p, wc.asyncErrs())
	}
	for _, ps := range p.Status.Partition {
		if ps.Owner != w.ID() {
			t.Fatalf("partition %d owned by %q, want %s", ps.Partition, ps.Owner, w.ID())
		}
	}
	// A look-up by job ID reads the results bucket and, for the dead
	// letter's reason, the dead-letter stream through an ordered
	// consumer: the worker's user may.
	code, p = page("a", "?job=order-1&key=k")
	if l := p.Lookup; code != http.StatusOK || l == nil || l.Error != "" || l.Job == nil || l.Job.Dead == nil || !strings.Contains(l.Job.Dead.Error, "declined") || !l.StateNotFound {
		t.Fatalf("worker-a's page looking up order-1: %d %+v (%v)", code, l, wc.asyncErrs())
	}
	start := time.Now()
	code, p = page("b")
	if code != http.StatusServiceUnavailable || p.Status != nil || !strings.Contains(p.Error, "namespace b") || !strings.Contains(p.Error, "Permissions Violation") {
		t.Fatalf("worker-a's page of namespace b: %d %+v", code, p)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("worker-a's page of namespace b took %s with a Timeout of 1s", took)
	}
}
