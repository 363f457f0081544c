package workercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/internal/otlp"
	"github.com/keylane/keylane/inventory"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/metrics"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Run starts an embedded NATS server unless c.URL is set, connects, and
// runs a worker with c.Worker until ctx ends, then drains it within
// c.Drain. stopped, if not nil, is called with the worker once it has
// stopped; its error joins Run's.
func Run(ctx context.Context, c Config, stopped func(*keylane.Worker) error) (err error) {
	log := c.Worker.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp, err := otlp.New(c.OTLPEndpoint, "keylane-worker")
	if err != nil {
		return err
	}
	if tp != nil {
		c.Worker.TracerProvider = tp
		// Runs last: after the worker stopped, its last spans are sent.
		defer func() { err = errors.Join(err, otlp.Shutdown(tp, 5*time.Second)) }()
		log.Info("exporting trace spans", "otlp_endpoint", c.OTLPEndpoint)
	}
	url := c.URL
	if url == "" {
		host, port, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("--listen port: %w", err)
		}
		s, err := embedded.Start(embedded.Config{Host: host, Port: p, StoreDir: c.Data, SyncAlways: c.SyncAlways})
		if errors.Is(err, embedded.ErrStoreInUse) {
			return fmt.Errorf("--data: %w; give each embedded server its own --data, or join the running one with --nats", err)
		}
		if errors.Is(err, embedded.ErrAddrInUse) {
			return fmt.Errorf("--listen: %w; pick a free --listen, or join the server there with --nats nats://%s", err, c.Listen)
		}
		if err != nil {
			return err
		}
		defer func() { s.Shutdown(); s.WaitForShutdown() }()
		url = s.ClientURL()
		log.Info("embedded NATS started", "url", url, "data", c.Data)
	}
	opts := append(connHandlers(log), nats.Name("keylane-worker"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.PingInterval(c.Ping), nats.MaxPingsOutstanding(2))
	nc, err := nats.Connect(url, append(opts, c.Auth...)...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", natsflags.Redact(url), err)
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	if c.Worker.Reducer == nil && c.Worker.Handler == nil && c.Worker.Applier == nil {
		c.Worker.Reducer = &inventory.Handler{}
	}
	var observed *metrics.Worker
	if c.Metrics != "" {
		observed = metrics.NewWorker()
		c.Worker.Observer = observed.Observer()
	}
	w, err := keylane.NewWorker(nc, c.Worker)
	if err != nil {
		return err
	}
	h := &health{nc: nc, w: w}
	if c.Metrics != "" {
		stopMetrics, err := serveMetrics(c.Metrics, nc, w, observed, h, c.Worker.Topology.Namespace, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	err = startChecked(ctx, w, func() (*nats.Conn, error) {
		return nats.Connect(url, append([]nats.Option{nats.Name("keylane-worker-probe"), nats.Timeout(2 * time.Second)}, c.Auth...)...)
	})
	if err != nil {
		err = startError(c, err)
	} else {
		h.started.Store(true)
		select {
		case <-ctx.Done():
			h.draining.Store(true)
			log.Info("stopping: signal received, draining", slog.Duration("within", c.Drain))
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Drain)
			err = w.Stop(sctx)
			cancel()
		case <-w.Done():
			// It stopped on its own (Worker.Err): exit with the reason,
			// a permanent one, not a restart loop's.
			h.draining.Store(true)
			err = startError(c, w.Err())
		}
	}
	if stopped != nil {
		err = errors.Join(err, stopped(w))
	}
	return err
}

// startChecked starts w while asking the server whether it has
// JetStream at all: without, every request the start makes ends "no
// responders available", which it takes for a server restarting and
// tries again for ever. A server that says it has none ends the start
// with natsflags.ErrNoJetStream, which says how to start one. The
// question goes on a connection of its own (probe), made with the
// worker's credentials: a user not allowed to ask ($JS.API.INFO) is then
// refused there, and the worker's connection carries no permission
// error that its own start would take for a refusal of its requests.
func startChecked(ctx context.Context, w *keylane.Worker, probe func() (*nats.Conn, error)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		nc, err := probe()
		if err != nil {
			return // the worker's own connection works: its start says more
		}
		defer nc.Close()
		if err := natsflags.CheckJetStream(ctx, nc); err != nil {
			cancel(err)
		}
	}()
	err := w.Start(ctx)
	if err == nil {
		cancel(nil) // started: JetStream answered; the probe need not wait
	}
	<-checked
	if cause := context.Cause(ctx); errors.Is(cause, natsflags.ErrNoJetStream) {
		return cause
	}
	return err
}

// startError says which flag to change when the worker is refused for a
// namespace made with other settings; the library's error stays inside,
// for errors.Is.
func startError(c Config, err error) error {
	switch {
	case errors.Is(err, lease.ErrBucketMismatch):
		return fmt.Errorf("--lease-ttl %s: %w; the namespace's lease bucket was made with another TTL: start with that --lease-ttl, or use another --namespace", c.Worker.Topology.LeaseTTL, err)
	case c.URL == "" && (errors.Is(err, keylane.ErrPartitionMismatch) || errors.Is(err, keylane.ErrShardsMismatch) || errors.Is(err, keylane.ErrReplicasMismatch)):
		return fmt.Errorf("--data %s: %w; the store there holds namespace %q made with other settings: start with its --partitions/--stream-shards/--replicas, move the directory away, or use another --data", c.Data, err, c.Worker.Topology.Namespace)
	case errors.Is(err, keylane.ErrPartitionMismatch):
		return fmt.Errorf("--partitions %d: %w", c.Worker.Topology.Partitions, err)
	case errors.Is(err, keylane.ErrReplyPrefixMismatch):
		return fmt.Errorf("--reply-prefix %q: %w", c.Worker.Topology.ReplyPrefix, err)
	case errors.Is(err, keylane.ErrMaxDeliverMismatch):
		return fmt.Errorf("--max-deliver %d: %w", c.Worker.MaxDeliver, err)
	case replicasRefused(err):
		return fmt.Errorf("--replicas %d: %w; the server is not part of a cluster: start with --replicas 1, or connect to a cluster", c.Worker.Topology.Replicas, err)
	}
	return err
}

// connHandlers log the connection's disconnects, reconnects and close
// through the worker's logger, so an operator sees why partitions moved.
func connHandlers(log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed on purpose (a stop): the closed handler says so
			}
			if err != nil {
				log.Warn("NATS disconnected; reconnecting", "err", err)
				return
			}
			log.Warn("NATS disconnected; reconnecting")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "url", natsflags.Redact(nc.ConnectedUrl()), "reconnects", nc.Reconnects)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				log.Info("NATS connection closed", "err", err)
				return
			}
			log.Info("NATS connection closed")
		}),
	}
}

// serveMetrics serves the worker's Prometheus metrics (its counters and
// gauges, the histograms its observer m feeds, the gauges of its
// namespace and of every other one it can see, the connection's state) on addr, h's
// /healthz and /readyz, and the namespace's status page at / (JSON at
// /status.json), until the returned function is called.
func serveMetrics(addr string, nc *nats.Conn, w *keylane.Worker, m *metrics.Worker, h *health, namespace string, log *slog.Logger) (func(), error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	// The worker's own series carry its namespace (the namespace's gauges
	// have it already): a dashboard or a rule over the workers of several
	// namespaces can then sum by namespace.
	prometheus.WrapRegistererWith(prometheus.Labels{"namespace": namespace}, reg).MustRegister(metrics.New(w), m, metrics.Connected(nc, w.ID()))
	// Every namespace the account lists, not only its own: a namespace
	// whose workers all died is reported by the workers of the others.
	reg.MustRegister(metrics.NewNamespaces(js, namespace), metrics.BuildInfo(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	page, err := statuspage.Handler(js, statuspage.Config{Namespace: namespace, Worker: w.ID()})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", h.healthz)
	mux.HandleFunc("/readyz", h.readyz)
	mux.Handle("/", page)
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
	log.Info("serving metrics and the status page", "addr", ln.Addr().String(), "page", "http://"+ln.Addr().String()+"/")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// replicasRefused reports whether err is the server's refusal of replicas
// above 1 outside a cluster (10074).
func replicasRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == natserr.CodeReplicasNotSupported
}
