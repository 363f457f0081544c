package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// TestStatusCommand runs `keylane status` against a namespace with one
// worker: the table names the owner of every partition and the member,
// --json decodes into keylane.Status, and bad flags are refused.
func TestStatusCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		ID:       "status-w",
		Topology: keylane.TopologyConfig{Namespace: "st", Partitions: 3, LeaseTTL: time.Second},
		Handler:  keylane.HandlerFunc(func(context.Context, keylane.Job) ([]byte, error) { return nil, nil }),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	testwait.Eventually(t, 10*time.Second, "the worker owns every partition", func() bool { return len(w.Owned()) == 3 })

	var out bytes.Buffer
	if err := run(ctx, []string{"status", "--nats", srv.ClientURL(), "--namespace", "st"}, &out, &out); err != nil {
		t.Fatalf("status: %v\n%s", err, out.String())
	}
	if got := strings.Count(out.String(), "status-w"); got != 4 { // the member line and three partitions
		t.Fatalf("status names status-w %d times, want 4:\n%s", got, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"status", "--nats", srv.ClientURL(), "--namespace", "st", "--json"}, &out, &out); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out.String())
	}
	var st keylane.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st.Partitions != 3 || len(st.Partition) != 3 || st.Partition[2].Owner != "status-w" {
		t.Fatalf("status --json: %+v, %v\n%s", st, err, out.String())
	}
	for _, args := range [][]string{{"status", "--watch", "-1s", "--nats", srv.ClientURL(), "--namespace", "st"}, {"status", "--nats", srv.ClientURL(), "--namespace", "nope"}} {
		if err := run(ctx, args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
