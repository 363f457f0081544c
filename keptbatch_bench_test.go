package keylane

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkKeepOutcomes counts, not times, what keeping a group's outcomes
// costs per outcome: messages into and out of the server (its counters),
// the bytes of both, and the allocations of the whole process (worker
// side and the in-process server), batched and as single puts, on one
// replica with and without sync_interval: always. Run with
// go test -run '^$' -bench KeepOutcomes -benchtime 50x . (its ns/op on a
// shared machine is an order of magnitude at best).
func BenchmarkKeepOutcomes(b *testing.B) {
	for _, sync := range []bool{false, true} {
		for _, group := range []int{8, 64} {
			for _, batched := range []bool{false, true} {
				b.Run(fmt.Sprintf("syncalways=%v/group=%d/batch=%v", sync, group, batched), func(b *testing.B) {
					benchKeep(b, sync, group, batched)
				})
			}
		}
	}
}

func benchKeep(b *testing.B, syncAlways bool, group int, batched bool) {
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: b.TempDir(), SyncAlways: syncAlways})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc := natstest.Connect(b, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topo, err := Setup(ctx, js, TopologyConfig{Partitions: 1})
	if err != nil {
		b.Fatal(err)
	}
	w := &Worker{nc: nc, js: js, topo: topo, cfg: WorkerConfig{StoreResults: true, OutcomeBatch: 2}}
	o := tenure.NewForTest(ctx, tenure.Config{NC: nc, JS: js, Topology: topo.Topology, StoreResults: true, OutcomeBatchMin: w.outcomeBatchMin(), Kept: &w.kept})
	if !batched {
		w.kept.PauseBatches(time.Now().Add(time.Hour))
	}
	ids := make([]string, group)
	val := []byte("o" + "n=12345")
	before, _ := srv.Varz(nil)
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		for i := range ids {
			ids[i] = fmt.Sprintf("job-%d-%d", n, i)
		}
		if err := o.PublishOutcomes(ids, val); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	after, _ := srv.Varz(nil)
	per := float64(b.N * group)
	b.ReportMetric(float64(after.InMsgs-before.InMsgs)/per, "msgs-in/outcome")
	b.ReportMetric(float64(after.OutMsgs-before.OutMsgs)/per, "msgs-out/outcome")
	b.ReportMetric(float64(after.InBytes-before.InBytes)/per, "bytes-in/outcome")
	b.ReportMetric(float64(after.OutBytes-before.OutBytes)/per, "bytes-out/outcome")
	if batched && w.kept.Batches() != int64(b.N) {
		b.Fatalf("%d batches for %d groups", w.kept.Batches(), b.N)
	}
}
