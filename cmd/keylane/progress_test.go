package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRepartitionProgress: with jobs to drain, `keylane repartition`
// draws a drain bar that ends at its total when --progress forces it, and
// draws nothing on a stderr that is not a terminal without it (the lines
// on stdout say how many are left instead).
func TestRepartitionProgress(t *testing.T) {
	// nats-server runs as a process: a repartition updates the jobs stream
	// while the worker re-creates its consumer, and nats-server 2.15.2
	// reads the stream's config without its lock there (fileStore
	// ConsumerStore against UpdateConfig), which the race detector reports
	// as this test's failure when the server runs inside the test.
	srv := natscluster.Start(t, natscluster.Options{Nodes: 1})
	nc, err := nats.Connect(srv.URLs())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, forced := range []bool{true, false} {
		ns := "plain"
		if forced {
			ns = "bars"
		}
		t.Run(ns, func(t *testing.T) {
			// The worker holds every job until the drain has counted
			// them, so it starts with all of them left.
			gate := make(chan struct{})
			w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
				Topology: keylane.TopologyConfig{Namespace: ns, Partitions: 2, LeaseTTL: time.Second},
				Handler: keylane.HandlerFunc(func(ctx context.Context, _ keylane.Job) ([]byte, error) {
					select {
					case <-gate:
					case <-ctx.Done():
					}
					return nil, nil
				}),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.Stop(context.Background()) }()
			c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const jobs = 6
			for i := range jobs {
				if _, err := c.Submit(ctx, "k"+strconv.Itoa(i), nil); err != nil {
					t.Fatal(err)
				}
			}
			// The handlers run once the drain has counted the jobs left.
			repartitionFunc = func(ctx context.Context, js jetstream.JetStream, ns string, n int, progress keylane.RepartitionProgress) error {
				var once sync.Once
				return keylane.Repartition(ctx, js, ns, n, func(left uint64) {
					progress(left)
					once.Do(func() { close(gate) })
				})
			}
			defer func() { repartitionFunc = keylane.Repartition }()
			var out, bars bytes.Buffer
			args := []string{"repartition", "--nats", srv.URLs(), "--namespace", ns, "--to", "4", "--timeout", "30s"}
			if forced {
				args = append(args, "--progress")
			}
			err = run(ctx, args, &out, &bars)
			if err != nil {
				t.Fatalf("repartition: %v\n%s", err, out.String())
			}
			if !forced {
				if bars.Len() != 0 || !strings.Contains(out.String(), "0 jobs left to drain") {
					t.Fatalf("without a terminal: stderr %q, stdout:\n%s", bars.String(), out.String())
				}
				return
			}
			final := bars.String()
			if i := strings.LastIndex(final, "\x1b[J"); i >= 0 {
				final = final[i:]
			}
			for _, want := range []string{"drain", strconv.Itoa(jobs) + " / " + strconv.Itoa(jobs), "done"} {
				if !strings.Contains(final, want) {
					t.Errorf("the bar's final state lacks %q: %q\nstdout:\n%s", want, final, out.String())
				}
			}
			if strings.Contains(out.String(), "jobs left to drain") {
				t.Errorf("the bar and the lines both count:\n%s", out.String())
			}
		})
	}
}
