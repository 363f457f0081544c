package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeadCommand: keylane dead list shows a dead-lettered job, show
// prints it, redrive --all runs it again once fixed, purge empties the
// stream; bad arguments are refused.
func TestDeadCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var broken atomic.Bool
	broken.Store(true)
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "dl", Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			if broken.Load() {
				return nil, keylane.Permanent(errors.New("card declined"))
			}
			return []byte("paid"), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "dl"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Call(ctx, "order:1", []byte("42 EUR"), keylane.WithID("pay-1")); err == nil {
		t.Fatal("the payment succeeded while broken")
	}
	url := srv.ClientURL()
	var out bytes.Buffer
	testwait.Eventually(t, 10*time.Second, "dead list shows pay-1", func() bool {
		out.Reset()
		return run(ctx, []string{"dead", "list", "--nats", url, "--namespace", "dl"}, &out, &out) == nil && strings.Contains(out.String(), "pay-1") && strings.Contains(out.String(), "card declined")
	})
	out.Reset()
	if err := run(ctx, []string{"dead", "show", "--nats", url, "--namespace", "dl", "1"}, &out, &out); err != nil || !strings.Contains(out.String(), `"42 EUR"`) {
		t.Fatalf("dead show: %v\n%s", err, out.String())
	}
	broken.Store(false)
	out.Reset()
	var bars bytes.Buffer
	if err := run(ctx, []string{"dead", "redrive", "--nats", url, "--namespace", "dl", "--all", "--progress"}, &out, &bars); err != nil || !strings.Contains(out.String(), "redriven as") {
		t.Fatalf("dead redrive --all: %v\n%s", err, out.String())
	}
	if final := bars.String()[strings.LastIndex(bars.String(), "\n\x1b[")+1:]; !strings.Contains(final, "redrive") || !strings.Contains(final, "1 / 1") || !strings.Contains(final, "done") {
		t.Fatalf("dead redrive --all --progress: the bar's final state is %q", final)
	}
	testwait.Eventually(t, 10*time.Second, "pay-1 answers with the redriven outcome", func() bool {
		res, err := c.Result(ctx, "pay-1")
		return err == nil && string(res) == "paid"
	})
	js, _ := jetstream.New(nc)
	if dls, err := keylane.DeadLetters(ctx, js, "dl", 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after redrive: %+v, %v", dls, err)
	}
	out.Reset()
	if err := run(ctx, []string{"dead", "purge", "--nats", url, "--namespace", "dl"}, &out, &out); err != nil || !strings.Contains(out.String(), "purged 0") {
		t.Fatalf("dead purge: %v\n%s", err, out.String())
	}
	for _, args := range [][]string{{"dead"}, {"dead", "nope", "--nats", url}, {"dead", "show", "--nats", url, "--namespace", "dl"}, {"dead", "show", "--nats", url, "--namespace", "dl", "x"}, {"dead", "list", "--limit", "0", "--nats", url}} {
		if err := run(ctx, args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
