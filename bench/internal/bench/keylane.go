package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natscluster"
	"github.com/keylane/keylane/internal/sale"
)

// workers is how many keylane workers every placement runs.
const workers = 3

// keylaneSale sells through keylane's inventory handler: with Call
// (request-reply) or, with submit set, SubmitMany and a wait until the
// jobs stream is empty, as sale.Run does.
type keylaneSale struct {
	submit bool
	// noIDs rows are a labelled variant: keylane names the jobs (no
	// caller's ID); the other rows send order IDs unless the ID knobs
	// turn them off.
	noIDs bool

	local   *sale.Local          // embedded
	srv     *natsServer          // separate
	cluster *natscluster.Cluster // cluster
	dir     string               // cluster: the nodes' stores
	worker  *child               // separate, cluster
	nc      *nats.Conn           // separate, cluster
	client  *keylane.Client
	pids    [2]int
	nodes   []int     // cluster: the node pids
	log     io.Writer // cluster: where the leaders and node CPU go
}

func (k *keylaneSale) Name() string {
	name := "keylane Call"
	if k.submit {
		name = "keylane Submit"
	}
	if k.noIDs {
		name += ", no IDs"
	}
	return name
}

// queue is the row's keylaneQueue: caller IDs (order IDs, as a shop
// sends them) unless the row is the no-IDs variant or the ID knobs turn
// them off.
func (k *keylaneSale) queue() queueShop {
	return queueShop{keylaneQueue{c: k.client,
		callIDs:   !k.noIDs && envInt("KEYLANE_BENCH_CALL_IDS", 1) != 0,
		submitIDs: !k.noIDs && envInt("KEYLANE_BENCH_SUBMIT_IDS", 1) != 0}}
}

func (k *keylaneSale) Kind() Kind { return Keylane }

func (k *keylaneSale) Setup(ctx context.Context, env Env) error {
	var err error
	if env.Placement == Embedded {
		k.local, err = sale.StartLocal(ctx, sale.LocalConfig{SyncAlways: env.Durable, Hold: env.Hold, Workers: workers,
			OutcomeBatch: outcomeBatch(env.Durable), StateBatch: envInt("KEYLANE_BENCH_STATE_BATCH", 0)})
		if err != nil {
			return err
		}
		k.client, err = k.local.Client(ctx)
		k.pids = [2]int{0, os.Getpid()}
		return err
	}
	if env.Placement == Cluster {
		return k.setupCluster(ctx, env)
	}
	if k.srv, err = startNATSServer(ctx, env.NATSServer, env.Durable); err != nil {
		return err
	}
	k.worker, err = startChild(ctx, "ready", env.Exe, "worker", "--nats", k.srv.URL, "--hold", env.Hold.String(),
		"--outcome-batch", strconv.Itoa(outcomeBatch(env.Durable)))
	if err != nil {
		return fmt.Errorf("start workers: %w", err)
	}
	if k.nc, err = nats.Connect(k.srv.URL, nats.Name("keylane-bench")); err != nil {
		return err
	}
	k.client, err = keylane.NewClient(ctx, k.nc, keylane.ClientConfig{})
	k.pids = [2]int{k.srv.pid(), k.worker.pid()}
	return err
}

// setupCluster starts three routed nats-server processes and the workers
// (replicas 3, env.StreamShards jobs streams), and reports where the
// shards' stream leaders are, after spreading them if asked.
func (k *keylaneSale) setupCluster(ctx context.Context, env Env) error {
	var err error
	if k.dir, err = os.MkdirTemp("", "keylane-bench-cluster-"); err != nil {
		return err
	}
	if k.cluster, err = natscluster.Launch(ctx, k.dir, natscluster.Options{Binary: env.NATSServer}); err != nil {
		return err
	}
	for _, n := range k.cluster.Nodes() {
		k.nodes = append(k.nodes, n.PID())
	}
	urls := k.cluster.URLs()
	k.worker, err = startChild(ctx, "ready", env.Exe, "worker", "--nats", urls, "--hold", env.Hold.String(),
		"--replicas", "3", "--stream-shards", strconv.Itoa(env.StreamShards))
	if err != nil {
		return fmt.Errorf("start workers: %w", err)
	}
	if k.nc, err = nats.Connect(urls, nats.Name("keylane-bench")); err != nil {
		return err
	}
	js, err := jetstream.New(k.nc)
	if err != nil {
		return err
	}
	var leaders []keylane.ShardLeader
	if env.SpreadLeaders {
		leaders, err = keylane.SpreadLeaders(ctx, js, "keylane")
	} else {
		leaders, err = keylane.ShardLeaders(ctx, js, "keylane")
	}
	if err != nil {
		return err
	}
	k.log = env.Progress
	if k.log != nil {
		var b strings.Builder
		for _, l := range leaders {
			fmt.Fprintf(&b, " %s=%s", l.Stream, l.Leader)
		}
		fmt.Fprintf(k.log, "  cluster, stream shards %d, leaders:%s\n", env.StreamShards, b.String())
	}
	k.client, err = keylane.NewClient(ctx, k.nc, keylane.ClientConfig{StreamShards: env.StreamShards})
	k.pids = [2]int{k.nodes[0], k.worker.pid()}
	return err
}

func (k *keylaneSale) Run(ctx context.Context, w Workload) (Result, error) {
	if k.cluster == nil {
		return sell(ctx, w, k.queue(), k.submit, k.pids[0], k.pids[1])
	}
	before := make([]time.Duration, len(k.nodes))
	for i, p := range k.nodes {
		before[i], _ = procCPU(p)
	}
	res, err := sell(ctx, w, k.queue(), k.submit, k.pids[0], k.pids[1], k.nodes[1:]...)
	if k.log != nil {
		var b strings.Builder
		for i, p := range k.nodes {
			after, _ := procCPU(p)
			fmt.Fprintf(&b, " %s %.1fs", k.cluster.Node(i).Name(), (after - before[i]).Seconds())
		}
		fmt.Fprintf(k.log, "  cluster node CPU over the whole run (stock, sale, check):%s\n", b.String())
	}
	return res, err
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
	if k.cluster != nil {
		k.cluster.Close()
	}
	if k.dir != "" {
		_ = os.RemoveAll(k.dir)
	}
	if k.local != nil {
		k.local.Stop(ctx)
	}
	*k = keylaneSale{submit: k.submit, noIDs: k.noIDs}
}

// keylaneQueue is a queue through a keylane Client.
type keylaneQueue struct {
	c                  *keylane.Client
	callIDs, submitIDs bool // give each purchase its caller's ID
}

func (q keylaneQueue) call(ctx context.Context, key string, payload []byte, id string) ([]byte, error) {
	if id == "" || !q.callIDs {
		// (Without a caller's ID a Call is batchable: ClientConfig.Batches.)
		return q.c.Call(ctx, key, payload)
	}
	return q.c.Call(ctx, key, payload, keylane.WithID(id))
}

func (q keylaneQueue) submit(ctx context.Context, keys []string, payload []byte, ids []string) error {
	reqs := make([]keylane.Request, len(keys))
	if !q.submitIDs {
		ids = nil // generated IDs: batchable (ClientConfig.Batches), no outcome kept by ID
	}
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

func (q keylaneQueue) backlog(ctx context.Context) (uint64, error) { return q.c.Stored(ctx) }

// WorkerOptions configure ServeWorker.
type WorkerOptions struct {
	// URL of the NATS server or servers (comma-separated). Required.
	URL string
	// Hold is the simulated I/O inside the critical section.
	Hold time.Duration
	// Replicas and StreamShards of the namespace when the workers create
	// it; 0 follows an existing one (1 when creating).
	Replicas, StreamShards int
	// OutcomeBatch is the workers' WorkerConfig.OutcomeBatch.
	OutcomeBatch int
}

// ServeWorker runs keylane's inventory workers against the NATS server at
// o.URL until ctx ends, then stops them gracefully. It prints "ready" to
// out once every partition has an owner. It is the hidden "worker"
// subcommand that the separate and cluster placements run in a child
// process.
func ServeWorker(ctx context.Context, o WorkerOptions, out io.Writer) error {
	if o.URL == "" {
		return errors.New("bench: worker needs --nats")
	}
	start, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := sale.StartLocal(start, sale.LocalConfig{URL: o.URL, Hold: o.Hold, Workers: workers,
		OutcomeBatch: o.OutcomeBatch,
		StateBatch:   envInt("KEYLANE_BENCH_STATE_BATCH", 0), // the child inherits the knob
		Topology:     keylane.TopologyConfig{Replicas: o.Replicas, StreamShards: o.StreamShards}})
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

// outcomeBatch is the workers' OutcomeBatch: with fsync on every write,
// 16, as WorkerConfig.OutcomeBatch advises for a one-replica server that
// syncs always; else the default (0: by replicas).
// KEYLANE_BENCH_OUTCOME_BATCH overrides it.
func outcomeBatch(durable bool) int {
	if durable {
		return envInt("KEYLANE_BENCH_OUTCOME_BATCH", keylane.SyncAlwaysOutcomeBatch)
	}
	return envInt("KEYLANE_BENCH_OUTCOME_BATCH", 0)
}

// knobs are the environment variables of the bench's experiments; the
// header names any that is set, and Run refuses one that is not a number.
var knobs = []string{"KEYLANE_BENCH_OUTCOME_BATCH", "KEYLANE_BENCH_STATE_BATCH", "KEYLANE_BENCH_SUBMIT_IDS", "KEYLANE_BENCH_CALL_IDS",
	"KEYLANE_BENCH_PG_PARTITIONS", "KEYLANE_BENCH_PG_CONCURRENCY", "KEYLANE_BENCH_PG_MAX_JOBS", "KEYLANE_BENCH_PG_NATS_SYNC",
	"KEYLANE_BENCH_PG_SHARDS", "KEYLANE_BENCH_PG_PIPELINE", "KEYLANE_BENCH_PG_SET"}

// durationKnobs are the knobs that are durations ("1ms"): the header
// names them too, and Run refuses one that is not a duration of 0 or more.
var durationKnobs = []string{"KEYLANE_BENCH_PG_CORK"}

// checkKnobs refuses a knob that is set but not an integer (a duration
// for durationKnobs): a typo must not run the default and be read as the
// experiment.
func checkKnobs() error {
	for _, k := range knobs {
		if v := os.Getenv(k); v != "" {
			if _, err := strconv.Atoi(v); err != nil {
				return fmt.Errorf("%s=%q is not an integer", k, v)
			}
		}
	}
	for _, k := range durationKnobs {
		if v := os.Getenv(k); v != "" {
			if d, err := time.ParseDuration(v); err != nil || d < 0 {
				return fmt.Errorf("%s=%q is not a duration of 0 or more", k, v)
			}
		}
	}
	return nil
}

// envInt reads an integer knob (checked by checkKnobs; the worker
// children inherit it); def when unset.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
