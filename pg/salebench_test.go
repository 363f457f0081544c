package keylanepg_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/shop"
)

// BenchmarkSale sets keylane in front of PostgreSQL beside PostgreSQL
// alone, in one run, for 64 buyers (b.SetParallelism(32) over GOMAXPROCS
// 2) on the same harness (a fresh server per contender: fsync on,
// synchronous_commit on): the hot SKU, and 10,000 SKUs with zipf 1.1
// demand. Contenders:
//
//	keylane             Calls to one worker with keylanepg.Applier and
//	                    shop.Sell: conditional UPDATE + order INSERT per
//	                    purchase, a partition's ready groups in one
//	                    transaction with the outcomes and the fence
//	conditional-update  UPDATE stock SET n = n - 1 WHERE sku = $1 AND n > 0,
//	                    one transaction a purchase, no order row
//	for-update-tx       BEGIN; SELECT … FOR UPDATE; UPDATE; INSERT order;
//	                    COMMIT
//
//	cd pg && go test -run '^$' -bench BenchmarkSale -benchtime 20000x .
func BenchmarkSale(b *testing.B) {
	for _, load := range []string{"hot", "zipf"} {
		for _, who := range []string{"keylane", "conditional-update", "for-update-tx"} {
			b.Run(load+"/"+who, func(b *testing.B) {
				_, db := startShop(b, 70)
				ctx := context.Background()
				if _, err := db.Exec(ctx, `INSERT INTO stock SELECT 'sku' || i, 1000000000000 FROM generate_series(0, 9999) AS i`); err != nil {
					b.Fatal(err)
				}
				var buy func(ctx context.Context, sku, id string) error
				switch who {
				case "keylane":
					buy = keylaneBuyer(b, db)
				case "conditional-update":
					buy = func(ctx context.Context, sku, _ string) error {
						_, err := shop.BuyConditional(ctx, db, sku)
						return err
					}
				default:
					buy = func(ctx context.Context, sku, id string) error {
						_, err := shop.BuyForUpdate(ctx, db, sku, id)
						return err
					}
				}
				var seq, seed atomic.Int64
				run := strconv.Itoa(b.N)
				b.SetParallelism(32)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					z := rand.NewZipf(rand.New(rand.NewPCG(uint64(seed.Add(1)), 7)), 1.1, 1, 9999)
					for pb.Next() {
						sku := "sku0"
						if load == "zipf" {
							sku = "sku" + strconv.FormatUint(z.Uint64(), 10)
						}
						if err := buy(ctx, sku, fmt.Sprintf("b%s-%d", run, seq.Add(1))); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
				b.StopTimer()
				if who != "conditional-update" {
					var orders int64
					if err := db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
						b.Fatal(err)
					}
					if orders != int64(b.N) {
						b.Errorf("%d order rows for %d purchases", orders, b.N)
					}
				}
			})
		}
	}
}

// keylaneBuyer starts a nats-server and one worker selling out of db, and
// returns a buy that Calls it.
func keylaneBuyer(b *testing.B, db *pgxpool.Pool) func(ctx context.Context, sku, id string) error {
	s := natstest.Start(b)
	topo := keylane.TopologyConfig{Namespace: ns, Partitions: 4}
	w, _ := startWorker(b, s.ClientURL(), topo, &keylanepg.Applier{DB: db, Handler: shop.Sell}, "bench")
	owned(b, w.Topology().Partitions, w)
	c := newClient(b, s.ClientURL())
	return func(ctx context.Context, sku, id string) error {
		res, err := c.Call(ctx, sku, []byte("buy 1"), keylane.WithID(id))
		if err == nil && string(res[:4]) != "sold" {
			err = fmt.Errorf("buy %s: %s", sku, res)
		}
		return err
	}
}
