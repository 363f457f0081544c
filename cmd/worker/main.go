// Command worker runs a keylane worker with the built-in inventory handler.
//
// With no NATS URL it starts an embedded nats-server (JetStream, store on
// disk) on 127.0.0.1:4222 so other workers and clients can join it; with
// --nats (or NATS_URL) it joins an existing server or cluster. SIGINT or
// SIGTERM drains gracefully: in-flight jobs finish and leases are released.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/inventory"
	"github.com/keylane/keylane/metrics"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

type config struct {
	url, listen, data, logLevel, trace, statsFile, metrics, crashOn string
	syncAlways                                                      bool
	drain, ping                                                     time.Duration
	hold                                                            time.Duration
	worker                                                          keylane.WorkerConfig
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func parse(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.StringVar(&c.url, "nats", os.Getenv("NATS_URL"), "NATS URL(s), comma-separated; empty starts an embedded server (env NATS_URL)")
	fs.StringVar(&c.listen, "listen", env("KEYLANE_LISTEN", "127.0.0.1:4222"), "embedded server address (env KEYLANE_LISTEN)")
	fs.StringVar(&c.data, "data", env("KEYLANE_DATA", "keylane-data"), "embedded server store directory (env KEYLANE_DATA)")
	fs.BoolVar(&c.syncAlways, "sync-always", os.Getenv("KEYLANE_SYNC_ALWAYS") == "1", "embedded server fsyncs every write (env KEYLANE_SYNC_ALWAYS=1)")
	fs.StringVar(&c.worker.Topology.Namespace, "namespace", env("KEYLANE_NAMESPACE", "keylane"), "namespace (env KEYLANE_NAMESPACE)")
	fs.IntVar(&c.worker.Topology.Partitions, "partitions", envInt("KEYLANE_PARTITIONS", 0), "partitions: 0 takes the stream's, or 16 when creating (env KEYLANE_PARTITIONS)")
	fs.IntVar(&c.worker.Topology.StreamShards, "stream-shards", envInt("KEYLANE_STREAM_SHARDS", 0), "jobs streams the partitions spread over (partition p in shard p % S), so several stream leaders share the storage work: 0 takes the namespace's, or 1 when creating; another count than the namespace's is refused (env KEYLANE_STREAM_SHARDS)")
	fs.IntVar(&c.worker.Topology.Replicas, "replicas", envInt("KEYLANE_REPLICAS", -1), "replicas of streams and buckets when creating them; an existing namespace with another count is refused. Default: 3 when --nats names more than one server (a cluster), else what exists, or 1 when creating (env KEYLANE_REPLICAS)")
	fs.DurationVar(&c.ping, "ping-interval", envDur("KEYLANE_PING_INTERVAL", 2*time.Second), "how often the connection checks the server; a worker on a paused or cut-off node notices within two of these (env KEYLANE_PING_INTERVAL)")
	fs.DurationVar(&c.worker.Topology.LeaseTTL, "lease-ttl", envDur("KEYLANE_LEASE_TTL", 10*time.Second), "partition lease TTL (env KEYLANE_LEASE_TTL)")
	fs.IntVar(&c.worker.Concurrency, "concurrency", envInt("KEYLANE_CONCURRENCY", 8), "keys of one partition run at once (env KEYLANE_CONCURRENCY)")
	fs.IntVar(&c.worker.MaxInFlight, "max-in-flight", envInt("KEYLANE_MAX_IN_FLIGHT", 1024), "fetched, unfinished jobs per partition (env KEYLANE_MAX_IN_FLIGHT)")
	fs.IntVar(&c.worker.MaxDeliver, "max-deliver", envInt("KEYLANE_MAX_DELIVER", 5), "attempts before dead-lettering (env KEYLANE_MAX_DELIVER)")
	fs.DurationVar(&c.worker.AckWait, "ack-wait", envDur("KEYLANE_ACK_WAIT", 30*time.Second), "server redelivery timeout (env KEYLANE_ACK_WAIT)")
	fs.BoolVar(&c.worker.StoreResults, "results", os.Getenv("KEYLANE_RESULTS") == "1", "store results in the results bucket (env KEYLANE_RESULTS=1)")
	fs.StringVar(&c.worker.ID, "id", os.Getenv("KEYLANE_WORKER_ID"), "worker ID (default host-pid-random; env KEYLANE_WORKER_ID)")
	fs.DurationVar(&c.drain, "drain", envDur("KEYLANE_DRAIN", 30*time.Second), "how long a graceful stop may take (env KEYLANE_DRAIN)")
	fs.DurationVar(&c.hold, "hold", 0, "pause inside each job's critical section (testing)")
	fs.StringVar(&c.crashOn, "crash-on", "", "exit the process at once when a job's payload is exactly this (testing: a job that kills its worker)")
	fs.StringVar(&c.trace, "trace", "", "append a JSON line per job run to this file (testing)")
	fs.StringVar(&c.statsFile, "stats", "", "write the worker's final counters as JSON to this file")
	fs.StringVar(&c.metrics, "metrics", os.Getenv("KEYLANE_METRICS"), "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (env KEYLANE_METRICS)")
	fs.StringVar(&c.logLevel, "log-level", env("KEYLANE_LOG_LEVEL", "info"), "debug, info, warn or error (env KEYLANE_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.worker.Topology.Replicas < 0 {
		c.worker.Topology.Replicas = 0 // follow the namespace, 1 when creating
		if strings.Count(c.url, ",") > 0 {
			c.worker.Topology.Replicas = 3 // a cluster
		}
	}
	if c.ping <= 0 {
		return c, fmt.Errorf("--ping-interval must be positive, got %s", c.ping)
	}
	return c, nil
}

func run(ctx context.Context, args []string) error {
	c, err := parse(args)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	c.worker.Logger = log

	url := c.url
	if url == "" {
		host, port, err := net.SplitHostPort(c.listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("--listen port: %w", err)
		}
		s, err := embedded.Start(embedded.Config{Host: host, Port: p, StoreDir: c.data, SyncAlways: c.syncAlways})
		if errors.Is(err, embedded.ErrStoreInUse) {
			return fmt.Errorf("--data: %w; give each embedded server its own --data, or join the running one with --nats", err)
		}
		if err != nil {
			return err
		}
		defer func() { s.Shutdown(); s.WaitForShutdown() }()
		url = s.ClientURL()
		log.Info("embedded NATS started", "url", url, "data", c.data)
	}
	nc, err := nats.Connect(url, nats.Name("keylane-worker"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.PingInterval(c.ping), nats.MaxPingsOutstanding(2))
	if err != nil {
		return err
	}
	defer nc.Close()
	if c.worker.ID == "" {
		c.worker.ID = keylane.DefaultWorkerID() // known before the handler's tracker needs it
	}
	var tracker *sale.Tracker
	if c.trace != "" {
		f, err := os.OpenFile(c.trace, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		tracker = sale.NewTracker(f, c.worker.ID)
	}
	h := &sale.Handler{Inventory: &inventory.Handler{}, Hold: c.hold, Tracker: tracker}
	c.worker.Reducer = h
	if c.crashOn != "" {
		c.worker.Reducer = crashing{h, c.crashOn, log}
	}
	w, err := keylane.NewWorker(nc, c.worker)
	if err != nil {
		return err
	}
	if c.metrics != "" {
		stopMetrics, err := serveMetrics(c.metrics, w, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	err = w.Run(ctx, c.drain)
	if c.statsFile != "" {
		b, _ := json.Marshal(w.Stats())
		if werr := os.WriteFile(c.statsFile, b, 0o644); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return err
}

// serveMetrics serves the worker's Prometheus metrics on addr until the
// returned function is called.
func serveMetrics(addr string, w *keylane.Worker, log *slog.Logger) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(w), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// crashing is the inventory reducer, exiting the process on one payload:
// a job that takes down every worker that runs it, for tests.
type crashing struct {
	*sale.Handler
	on  string
	log *slog.Logger
}

func (c crashing) Reduce(ctx context.Context, j keylane.Job, cur []byte) ([]byte, []byte, error) {
	if string(j.Payload) == c.on {
		c.log.Error("crashing on purpose", "job_id", j.ID, "attempt", j.Attempt)
		os.Exit(99)
	}
	return c.Handler.Reduce(ctx, j, cur)
}
