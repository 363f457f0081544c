package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestStateAndJobCommands: keylane state get prints a reducer's key's
// value and held outcomes; keylane job finds a Call's outcome in the
// results bucket, an unnamed job's in its key's state (--key), a
// dead-lettered job's with its reason (kept by ID, and only in the
// dead-letter stream), and says "not found" with exit 3 otherwise; a bad
// key or ID is refused with a clear error.
func TestStateAndJobCommands(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "shop", Partitions: 2, LeaseTTL: time.Second},
		Reducer: keylane.ReducerFunc(func(_ context.Context, job keylane.Job, state []byte) ([]byte, []byte, error) {
			if string(job.Payload) == "bad" {
				return nil, nil, keylane.Permanent(errors.New("card declined"))
			}
			n, _ := strconv.Atoi(string(state))
			n++
			return []byte(strconv.Itoa(n)), []byte("sold " + strconv.Itoa(n)), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if res, err := c.Call(ctx, "sku:1", []byte("buy"), keylane.WithID("buy-1")); err != nil || string(res) != "sold 1" {
		t.Fatalf("call: %q, %v", res, err)
	}
	unnamed, err := c.Submit(ctx, "sku:1", []byte("buy"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "sku:2", []byte("bad"), keylane.WithID("pay-1")); err == nil {
		t.Fatal("the bad job succeeded")
	}
	deadUnnamed, err := c.Submit(ctx, "sku:3", []byte("bad"))
	if err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	cmd := func(args ...string) (string, int) {
		var out bytes.Buffer
		err := run(ctx, append(args, "--nats", url, "--namespace", "shop"), &out, &out)
		return out.String() + errText(err), exitCode(err)
	}
	testwait.Eventually(t, 10*time.Second, "the unnamed job applied", func() bool {
		out, code := cmd("state", "get", "sku:1")
		return code == 0 && strings.Contains(out, `value:     "2"`)
	})
	out, code := cmd("state", "get", "sku:1")
	for _, want := range []string{"buy-1", `"sold 1"`, unnamed, `"sold 2"`, "held outcomes: 2"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("state get sku:1 (exit %d) does not say %q:\n%s", code, want, out)
		}
	}
	out, code = cmd("state", "get", "sku:1", "--json")
	var js struct {
		Key      string
		Revision uint64
		Value    []byte
		JobID    string
		Held     int
	}
	if code != 0 || json.Unmarshal([]byte(out), &js) != nil || js.Key != "sku:1" || string(js.Value) != "2" || js.JobID != unnamed || js.Held != 2 || js.Revision == 0 {
		t.Fatalf("state get --json (exit %d): %+v\n%s", code, js, out)
	}
	if out, code = cmd("state", "get", "sku:none"); code != 3 || !strings.Contains(out, "no state entry") {
		t.Fatalf("state get of a key never written: exit %d\n%s", code, out)
	}
	if out, code = cmd("state", "get", ""); code != 1 || !strings.Contains(out, "key") || !strings.Contains(out, "empty") {
		t.Fatalf("state get of an empty key: exit %d\n%s", code, out)
	}
	if out, code = cmd("state", "get", "a", "b"); code != 2 || !strings.Contains(out, "want one key") {
		t.Fatalf("state get of two keys: exit %d\n%s", code, out)
	}

	if out, code = cmd("job", "buy-1"); code != 0 || !strings.Contains(out, "results bucket (by job ID)") || !strings.Contains(out, `result: "sold 1"`) {
		t.Fatalf("job buy-1: exit %d\n%s", code, out)
	}
	if out, code = cmd("job", unnamed); code != 3 || !strings.Contains(out, "not found") || !strings.Contains(out, "expire after") {
		t.Fatalf("job %s without --key: exit %d\n%s", unnamed, code, out)
	}
	if out, code = cmd("job", unnamed, "--key", "sku:1"); code != 0 || !strings.Contains(out, "state entry (held outcomes)") || !strings.Contains(out, `"sold 2"`) {
		t.Fatalf("job %s --key sku:1: exit %d\n%s", unnamed, code, out)
	}
	testwait.Eventually(t, 10*time.Second, "both bad jobs dead-lettered", func() bool {
		n, _, _, err := keylane.DeadLetterSpan(ctx, jsOf(t, nc), "shop")
		return err == nil && n == 2
	})
	if out, code = cmd("job", "pay-1"); code != 0 || !strings.Contains(out, "results bucket (by job ID)") || !strings.Contains(out, "failed:") || !strings.Contains(out, "reason: ") || !strings.Contains(out, "card declined") {
		t.Fatalf("job pay-1: exit %d\n%s", code, out)
	}
	// A job of a batch message (every job: one wire path) that was
	// dead-lettered has its outcome kept by ID (so a redelivered batch
	// never runs it again): found there, its dead letter beside it.
	if out, code = cmd("job", deadUnnamed); code != 0 || !strings.Contains(out, "results bucket (by job ID)") || !strings.Contains(out, "dead letter ") || !strings.Contains(out, "card declined") || !strings.Contains(out, `key "sku:3"`) {
		t.Fatalf("job %s (dead-lettered, no ID of ours): exit %d\n%s", deadUnnamed, code, out)
	}
	out, code = cmd("job", deadUnnamed, "--json")
	var f keylane.FoundJob
	if code != 0 || json.Unmarshal([]byte(out), &f) != nil || f.Where != keylane.FoundResults || f.Dead == nil || f.Dead.Key != "sku:3" || !strings.Contains(f.Error, "card declined") {
		t.Fatalf("job --json (exit %d): %+v\n%s", code, f, out)
	}
	if out, code = cmd("job", "a..b"); code != 1 || !strings.Contains(out, "job ID") {
		t.Fatalf("job a..b: exit %d\n%s", code, out)
	}
	if out, code = cmd("job", "x-1", "--key", ""); code != 3 {
		t.Fatalf("job with an empty --key: exit %d\n%s", code, out)
	}
	if out, code = cmd("job"); code != 2 || !strings.Contains(out, "usage: keylane job") {
		t.Fatalf("job without an ID: exit %d\n%s", code, out)
	}
	// A namespace that does not exist: a clear error, not "not found".
	var o bytes.Buffer
	if err := run(ctx, []string{"job", "buy-1", "--nats", url, "--namespace", "nope"}, &o, &o); exitCode(err) != 1 || !strings.Contains(errText(err), "no results bucket") {
		t.Fatalf("job in a namespace that does not exist: %v\n%s", err, o.String())
	}
}

func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestNamespaceDelete: keylane namespace delete lists a namespace's
// streams and buckets and deletes nothing without --yes, refuses while a
// worker holds a lease (unless --force), then deletes exactly its
// streams and buckets: another namespace, "shop2", whose name begins
// with "shop", keeps every one of its own. A namespace that does not
// exist is refused.
func TestNamespaceDelete(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []keylane.TopologyConfig{
		{Namespace: "shop", Partitions: 4, StreamShards: 2, Delays: true},
		{Namespace: "shop2", Partitions: 2},
		{Namespace: "shop-eu", Partitions: 2},
	} {
		if _, err := keylane.Setup(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
	}
	// An object of no namespace, named like one.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SHOP_JOBS_X", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	streams := func() []string {
		var names []string
		l := js.StreamNames(ctx)
		for n := range l.Name() {
			names = append(names, n)
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	before := streams()
	shops := []string{"KV_SHOP_LEASES", "KV_SHOP_MEMBERS", "KV_SHOP_RESULTS", "KV_SHOP_STATE", "SHOP_DEAD", "SHOP_DELAYS", "SHOP_JOBS", "SHOP_JOBS_1"}
	for _, s := range shops {
		if !slices.Contains(before, s) {
			t.Fatalf("no %s among %v", s, before)
		}
	}
	url := srv.ClientURL()
	cmd := func(args ...string) (string, int) {
		var out bytes.Buffer
		err := run(ctx, append(args, "--nats", url), &out, &out)
		return out.String() + errText(err), exitCode(err)
	}
	out, code := cmd("namespace", "delete", "shop")
	if code != 1 || !strings.Contains(out, "add --yes") || !strings.Contains(out, "8 streams and buckets") {
		t.Fatalf("namespace delete without --yes: exit %d\n%s", code, out)
	}
	for _, s := range shops {
		if !strings.Contains(out, "  "+s+"\n") {
			t.Fatalf("namespace delete does not list %s:\n%s", s, out)
		}
	}
	if got := streams(); !slices.Equal(got, before) {
		t.Fatalf("without --yes the streams changed: %v, before %v", got, before)
	}

	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "shop"},
		Handler:  keylane.HandlerFunc(func(context.Context, keylane.Job) ([]byte, error) { return nil, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = w.Stop(context.Background())
		}
	}()
	testwait.Eventually(t, 10*time.Second, "the worker holds leases", func() bool {
		held, err := keylane.LiveLeases(ctx, js, "shop")
		return err == nil && len(held) > 0
	})
	if out, code = cmd("namespace", "delete", "shop", "--yes"); code != 1 || !strings.Contains(out, "workers hold leases") || !strings.Contains(out, "--force") {
		t.Fatalf("namespace delete with a live worker: exit %d\n%s", code, out)
	}
	if got := streams(); !slices.Equal(got, before) {
		t.Fatalf("refused, yet the streams changed: %v, before %v", got, before)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	testwait.Eventually(t, 10*time.Second, "the leases are free", func() bool {
		held, err := keylane.LiveLeases(ctx, js, "shop")
		return err == nil && len(held) == 0
	})
	if out, code = cmd("namespace", "delete", "shop", "--yes"); code != 0 || !strings.Contains(out, "namespace shop deleted") {
		t.Fatalf("namespace delete --yes: exit %d\n%s", code, out)
	}
	want := slices.DeleteFunc(slices.Clone(before), func(s string) bool { return slices.Contains(shops, s) })
	if got := streams(); !slices.Equal(got, want) {
		t.Fatalf("after delete: %v, want %v", got, want)
	}
	if out, code = cmd("namespace", "delete", "shop", "--yes"); code != 1 || !strings.Contains(out, "does not exist") {
		t.Fatalf("namespace delete of a deleted namespace: exit %d\n%s", code, out)
	}
	if out, code = cmd("namespace", "delete", "sh.op", "--yes"); code != 1 || !strings.Contains(out, "must match") {
		t.Fatalf("namespace delete of a bad name: exit %d\n%s", code, out)
	}
	if out, code = cmd("namespace", "delete"); code != 2 || !strings.Contains(out, "name the namespace") {
		t.Fatalf("namespace delete without a name: exit %d\n%s", code, out)
	}
	if got := streams(); !slices.Equal(got, want) {
		t.Fatalf("refusals changed the streams: %v, want %v", got, want)
	}
	// shop2 still works.
	if _, err := keylane.Inspect(ctx, js, "shop2"); err != nil {
		t.Fatalf("shop2 after deleting shop: %v", err)
	}
}
