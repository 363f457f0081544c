package keylane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkKeptLookUp times one look-up of a kept outcome by job ID, the
// way a redelivered job or a lone job with a caller's ID is looked up: a
// direct get (kv.Get, which any replica answers, and which a lagging
// follower can answer "not kept") against a get the stream's leader
// answers (leaderGet, what the worker uses). On one in-process server,
// and on three nats-server processes with R3 (the client on a node that
// may or may not lead the stream). Run with
// go test -run '^$' -bench KeptLookUp -benchtime 2000x .
// (an order of magnitude on a shared machine, no more).
func BenchmarkKeptLookUp(b *testing.B) {
	b.Run("one-server", func(b *testing.B) {
		srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		benchLookUp(b, natstest.Connect(b, srv), 1)
	})
	b.Run("three-nodes-R3", func(b *testing.B) {
		c := natscluster.Start(b, natscluster.Options{})
		nc, err := nats.Connect(c.Node(0).URL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		benchLookUp(b, nc, 3)
	})
}

func benchLookUp(b *testing.B, nc *nats.Conn, replicas int) {
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topo, err := Setup(ctx, js, TopologyConfig{Namespace: "bench", Partitions: 1, Replicas: replicas})
	if err != nil {
		b.Fatal(err)
	}
	const ids = 100
	for i := range ids {
		if _, err := topo.Results.Put(ctx, fmt.Sprintf("job-%d", i), encodeResult([]byte("done"), nil, false)); err != nil {
			b.Fatal(err)
		}
	}
	stream, prefix := "KV_"+topo.Names.Results(), "$KV."+topo.Names.Results()+"."
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for n := range b.N {
			if _, err := topo.Results.Get(ctx, fmt.Sprintf("job-%d", n%ids)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("leader", func(b *testing.B) {
		b.ReportAllocs()
		for n := range b.N {
			if _, err := leaderGet(ctx, nc, stream, prefix+fmt.Sprintf("job-%d", n%ids)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
