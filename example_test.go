package keylane_test

import (
	"context"
	"fmt"
	"os"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Seats are booked through keylane: two buyers race for seat A7, the jobs
// run one at a time on the partition owner, and State applies each booking
// exactly once.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "keylane-example-")
	defer os.RemoveAll(dir)
	srv, _ := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	js, _ := jetstream.New(nc)
	topo, _ := keylane.Setup(ctx, js, keylane.TopologyConfig{})
	seats := keylane.NewState(topo.State)
	book := keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		return seats.Apply(ctx, job, func(holder []byte) ([]byte, []byte, error) {
			if holder != nil {
				return holder, []byte("taken by " + string(holder)), nil
			}
			return job.Payload, []byte("booked"), nil
		})
	})
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Handler: book})
	_ = w.Start(ctx)
	defer w.Stop(ctx)

	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
	for _, who := range []string{"ann", "bob"} {
		res, err := c.Call(ctx, "seat:A7", []byte(who))
		fmt.Println(who, string(res), err)
	}
	// Output:
	// ann booked <nil>
	// bob taken by ann <nil>
}
