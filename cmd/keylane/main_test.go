package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRepartitionCommand runs `keylane repartition` against a live
// namespace with a worker, and `keylane adopt`.
func TestRepartitionCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "cli", Partitions: 4, LeaseTTL: time.Second},
		Reducer: keylane.ReducerFunc(func(_ context.Context, _ keylane.Job, cur []byte) ([]byte, []byte, error) {
			return append(cur, 'x'), nil, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Call(ctx, "k", nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"repartition", "--nats", srv.ClientURL(), "--namespace", "cli", "--to", "8"}, &out, &out); err != nil {
		t.Fatalf("repartition: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "8 partitions") {
		t.Fatalf("output:\n%s", out.String())
	}
	js, _ := jetstream.New(nc)
	meta, err := keylane.Open(ctx, js, "cli", 8)
	if err != nil || len(meta.Adopted) != 1 {
		t.Fatalf("after repartition: %+v, %v", meta, err)
	}
	out.Reset()
	if err := run(ctx, []string{"adopt", "--nats", srv.ClientURL(), "--namespace", "cli", "--epoch", "abc"}, &out, &out); err != nil {
		t.Fatalf("adopt: %v\n%s", err, out.String())
	}
	if meta, _ := keylane.Open(ctx, js, "cli", 8); len(meta.Adopted) != 2 {
		t.Fatalf("adopted %x", meta.Adopted)
	}
	for _, args := range [][]string{nil, {"nope"}, {"repartition"}, {"repartition", "--to", "-1"}, {"adopt", "--epoch", "zz"}} {
		if err := run(ctx, args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// TestLeadersCommand runs `keylane leaders` on a namespace of two jobs
// stream shards: it lists both, spreads nothing on one server, and
// refuses an expected shard count that differs.
func TestLeadersCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "cli", Partitions: 4, StreamShards: 2}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"leaders", "--nats", srv.ClientURL(), "--namespace", "cli", "--spread", "--stream-shards", "2"}, &out, &out); err != nil {
		t.Fatalf("leaders: %v\n%s", err, out.String())
	}
	for _, want := range []string{"4 partitions over 2 jobs stream shards", "shard 0 CLI_JOBS", "shard 1 CLI_JOBS_1"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	err := run(ctx, []string{"leaders", "--nats", srv.ClientURL(), "--namespace", "cli", "--stream-shards", "3"}, &out, &out)
	if !errors.Is(err, keylane.ErrShardsMismatch) {
		t.Fatalf("leaders expecting 3 shards: %v", err)
	}
}
