package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// BenchmarkCalls runs concurrent Calls through a Handler worker on an
// in-process NATS, without and with the Prometheus observers on the
// worker and the client: what measuring costs a job end to end.
//
//	go test -run XXX -bench Calls -benchtime 5000x ./metrics
func BenchmarkCalls(b *testing.B) {
	for _, observed := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[observed], func(b *testing.B) {
			srv := natstest.Start(b)
			nc := natstest.Connect(b, srv)
			ctx := context.Background()
			cfg := keylane.WorkerConfig{
				Topology: keylane.TopologyConfig{Namespace: "bench", Partitions: 4},
				Handler:  echo,
			}
			var ccfg keylane.ClientConfig
			ccfg.Namespace = "bench"
			if observed {
				cfg.Observer, ccfg.Observer = NewWorker().Observer(), NewClient().Observer()
			}
			w, err := keylane.NewWorker(nc, cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer func() {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_ = w.Stop(sctx)
			}()
			testwait.Eventually(b, 10*time.Second, "partitions owned", func() bool { return len(w.Owned()) == 4 })
			c, err := keylane.NewClient(ctx, nc, ccfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetParallelism(16)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i++
					if _, err := c.Call(ctx, fmt.Sprintf("k%d", i%64), []byte("x")); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}
