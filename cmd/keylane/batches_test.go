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

// TestBatchesCommand: `keylane batches on|off` writes the namespace's
// keylane.batches (honouring --namespace), status shows it, a worker
// without Batches is then refused, and anything but on or off is refused.
func TestBatchesCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	topo := keylane.TopologyConfig{Namespace: "cli", Partitions: 2, LeaseTTL: time.Second}
	if _, err := keylane.Setup(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, args := range [][]string{{"batches"}, {"batches", "yes"}, {"batches", "on", "off"}, {"batches", "--namespace", "nowhere", "on"}} {
		out.Reset()
		if err := run(ctx, append(args, "--nats", srv.ClientURL()), &out, &out); err == nil {
			t.Errorf("run(%q) succeeded:\n%s", args, out.String())
		}
	}
	if meta, err := keylane.Open(ctx, js, "cli", 0); err != nil || meta.Batches {
		t.Fatalf("after refused commands: %+v, %v", meta, err)
	}
	out.Reset()
	if err := run(ctx, []string{"batches", "--nats", srv.ClientURL(), "--namespace", "cli", "on"}, &out, &out); err != nil || !strings.Contains(out.String(), "batches on") {
		t.Fatalf("batches on: %v\n%s", err, out.String())
	}
	if meta, err := keylane.Open(ctx, js, "cli", 0); err != nil || !meta.Batches {
		t.Fatalf("after batches on: %+v, %v", meta, err)
	}
	out.Reset()
	if err := run(ctx, []string{"status", "--nats", srv.ClientURL(), "--namespace", "cli"}, &out, &out); err != nil || !strings.Contains(out.String(), "batches: on") {
		t.Fatalf("status: %v\n%s", err, out.String())
	}
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{Topology: topo, Handler: keylane.HandlerFunc(func(context.Context, keylane.Job) ([]byte, error) { return nil, nil })})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); !errors.Is(err, keylane.ErrBatchesMismatch) {
		t.Fatalf("a worker without Batches after batches on: %v", err)
	}
	out.Reset()
	if err := run(ctx, []string{"batches", "--nats", srv.ClientURL(), "--namespace", "cli", "off"}, &out, &out); err != nil {
		t.Fatalf("batches off: %v\n%s", err, out.String())
	}
	if meta, err := keylane.Open(ctx, js, "cli", 0); err != nil || meta.Batches {
		t.Fatalf("after batches off: %+v, %v", meta, err)
	}
}
