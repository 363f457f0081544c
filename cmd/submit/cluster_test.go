package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/inventory"
	"github.com/nats-io/nats.go"
)

// gatedInventory is the inventory reducer whose purchases wait for open
// to close (or their job's context to end): the sale's wait for an empty
// backlog then spans what the test does meanwhile.
type gatedInventory struct {
	inventory.Handler
	open <-chan struct{}
}

func (g *gatedInventory) Reduce(ctx context.Context, job keylane.Job, cur []byte) ([]byte, []byte, error) {
	if strings.HasPrefix(string(job.Payload), "buy") {
		select {
		case <-g.open:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return g.Handler.Reduce(ctx, job, cur)
}

// TestFireAndForgetSaleRidesOutRollingRestart: `submit sale --nats
// --fire-and-forget` against a three-node cluster whose nodes are
// restarted one by one while the sale waits for its purchases to run
// (every one stored, none applied yet). A request that times out while a
// node restarts is tried again within the sale's --timeout: the sale ends
// with its verdict OK, not "context deadline exceeded".
func TestFireAndForgetSaleRidesOutRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster and a rolling restart: skipped in -short")
	}
	cl := natscluster.Start(t, natscluster.Options{Nodes: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	open := make(chan struct{})
	opened := false
	const ns, purchases = "rolling", 2000
	for i := range 2 {
		nc, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.PingInterval(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
			ID:         "w" + string(rune('a'+i)),
			Topology:   keylane.TopologyConfig{Namespace: ns, Partitions: 4, Replicas: 3, LeaseTTL: 2 * time.Second},
			Reducer:    &gatedInventory{open: open},
			MaxDeliver: 1000, // purchases held through a rolling restart are not dead letters
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = w.Stop(sctx)
		}()
	}
	defer func() { // runs before the workers stop: their held purchases end
		if !opened {
			close(open)
		}
	}()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"sale", "--nats", cl.URLs(), "--namespace", ns, "--fire-and-forget",
			"--purchases", "2000", "--skus", "3", "--stock", "500", "--timeout", "3m"}, &out, &bytes.Buffer{})
	}()
	probe, err := nats.Connect(cl.URLs(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	client, err := keylane.NewClient(ctx, probe, keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	testwait.Eventually(t, time.Minute, "every purchase stored, none applied", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the sale ended before the restart: %v\n%s", err, out.String())
		default:
		}
		n, err := client.Backlog(ctx)
		return err == nil && n == purchases
	})
	for _, n := range cl.Nodes() {
		if err := n.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.WaitHealthy(ctx); err != nil {
			t.Fatalf("cluster not healthy after restarting %s: %v", n.Name(), err)
		}
		t.Logf("restarted %s", n.Name())
		select {
		case err := <-done:
			t.Fatalf("the sale ended during the rolling restart, its purchases stored: %v\n%s", err, out.String())
		default:
		}
	}
	close(open)
	opened = true
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "verdict: OK") {
			t.Fatalf("sale after a rolling restart: %v\n%s", err, out.String())
		}
	case <-ctx.Done():
		t.Fatal("the sale did not end within 4 minutes")
	}
}
