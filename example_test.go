package keylane_test

import (
	"context"
	"fmt"
	"os"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats.go"
)

// Seats are booked through keylane: two buyers race for seat A7, the jobs
// run one at a time on the partition owner, and the worker stores each
// seat's holder, applying each booking exactly once.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "keylane-example-")
	defer os.RemoveAll(dir)
	srv, _ := embedded.Start(embedded.Config{Port: -1, StoreDir: dir})
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()

	// A Reducer turns a seat's holder and a job into the new holder and
	// the job's result. It has no other side effect, so the worker can
	// group-commit a hot seat's queued jobs with one state write.
	book := keylane.ReducerFunc(func(ctx context.Context, job keylane.Job, holder []byte) ([]byte, []byte, error) {
		if holder != nil {
			return holder, []byte("taken by " + string(holder)), nil
		}
		return job.Payload, []byte("booked"), nil
	})
	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Reducer: book})
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
