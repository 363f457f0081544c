package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/inventory"
)

// workers is how many keylane workers every placement runs.
const workers = 3

// keylaneSale sells through keylane's inventory handler: with Call
// (request-reply) or, with submit set, SubmitMany and a wait until the
// jobs stream is empty, as inventory.RunSale does.
type keylaneSale struct {
	submit bool

	local  *inventory.Local // embedded
	srv    *natsServer      // separate
	worker *child           // separate
	nc     *nats.Conn       // separate
	client *keylane.Client
	pids   [2]int
}

func (k *keylaneSale) Name() string {
	if k.submit {
		return "keylane Submit"
	}
	return "keylane Call"
}

func (k *keylaneSale) Kind() Kind { return Keylane }

func (k *keylaneSale) Setup(ctx context.Context, env Env) error {
	var err error
	if env.Placement == Embedded {
		k.local, err = inventory.StartLocal(ctx, inventory.LocalConfig{SyncAlways: env.Durable, Hold: env.Hold, Workers: workers})
		if err != nil {
			return err
		}
		k.client, err = k.local.Client(ctx)
		k.pids = [2]int{0, os.Getpid()}
		return err
	}
	if k.srv, err = startNATSServer(ctx, env.NATSServer, env.Durable); err != nil {
		return err
	}
	k.worker, err = startChild(ctx, "ready", env.Exe, "worker", "--nats", k.srv.URL, "--hold", env.Hold.String())
	if err != nil {
		return fmt.Errorf("start workers: %w", err)
	}
	if k.nc, err = nats.Connect(k.srv.URL, nats.Name("keylane-bench")); err != nil {
		return err
	}
	// As inventory.Local's clients: group commit when every write is synced.
	k.client, err = keylane.NewClient(ctx, k.nc, keylane.ClientConfig{AtomicBatches: env.Durable})
	k.pids = [2]int{k.srv.pid(), k.worker.pid()}
	return err
}

func (k *keylaneSale) Run(ctx context.Context, w Workload) (Result, error) {
	return sell(ctx, w, queueShop{keylaneQueue{k.client}}, k.submit, k.pids[0], k.pids[1])
}

func (k *keylaneSale) Teardown(ctx context.Context) {
	if k.client != nil {
		k.client.Close()
	}
	if k.nc != nil {
		k.nc.Close()
	}
	if k.worker != nil {
		k.worker.stop(15 * time.Second)
	}
	if k.srv != nil {
		k.srv.Stop()
	}
	if k.local != nil {
		k.local.Stop(ctx)
	}
	*k = keylaneSale{submit: k.submit}
}

// keylaneQueue is a queue through a keylane Client.
type keylaneQueue struct{ c *keylane.Client }

func (q keylaneQueue) call(ctx context.Context, key string, payload []byte, id string) ([]byte, error) {
	if id == "" {
		return q.c.Call(ctx, key, payload)
	}
	return q.c.Call(ctx, key, payload, keylane.WithID(id))
}

func (q keylaneQueue) submit(ctx context.Context, keys []string, payload []byte, ids []string) error {
	reqs := make([]keylane.Request, len(keys))
	for i, k := range keys {
		reqs[i] = keylane.Request{Key: k, Payload: payload}
		if ids != nil {
			reqs[i].ID = ids[i]
		}
	}
	out, err := q.c.SubmitMany(ctx, reqs)
	if err != nil {
		return err
	}
	for _, s := range out {
		if s.Err != nil {
			return fmt.Errorf("submit %s: %w", s.ID, s.Err)
		}
	}
	return nil
}

func (q keylaneQueue) backlog(ctx context.Context) (uint64, error) { return q.c.Backlog(ctx) }

// ServeWorker runs keylane's inventory workers against the NATS server at
// url until ctx ends, then stops them gracefully. It prints "ready" to out
// once every partition has an owner. It is the hidden "worker" subcommand
// that the separate placement runs in a child process.
func ServeWorker(ctx context.Context, url string, hold time.Duration, out io.Writer) error {
	if url == "" {
		return errors.New("bench: worker needs --nats")
	}
	start, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := inventory.StartLocal(start, inventory.LocalConfig{URL: url, Hold: hold, Workers: workers})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "ready")
	<-ctx.Done()
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	l.Stop(stop)
	return nil
}
