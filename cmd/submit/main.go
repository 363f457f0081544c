// Command submit submits keylane jobs from the command line, and runs flash
// sales against workers. The benchmark is its own command, in the bench
// module (cd bench && go run . -h).
//
//	submit sale                       # embedded NATS + 3 workers in this process
//	submit sale --nats nats://…       # against running workers
//	submit call --key sku:1 --payload "buy 1"
//	submit send --key sku:1 --payload "restock 10" --id restock-42
//	submit bulk --file jobs.jsonl     # one {"key":…,"payload":…,"id":…} per line
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/internal/otlp"
	"github.com/keylane/keylane/internal/progress"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/metrics"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	ctx, stop := cmdutil.SignalContext("submit", nil) // a second Ctrl-C exits at once
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	cmdutil.Exit("submit", err)
}

// exitError is an exit that has already been explained (cmdutil.ExitError).
type exitError = cmdutil.ExitError

const usage = `usage: submit <command> [flags]

commands:
  sale    run a flash sale and check it (no --nats: embedded NATS and workers in this process)
  call    submit one job and print its result
  send    submit one job and print its ID
  bulk    submit JSON lines {"key":…,"payload":…,"id":…,"type":…} from a file or stdin, fire-and-forget
  version the command's version (also --version)

run "submit <command> -h" for flags. Exit status: 0 done, 1 failed, 2 a usage error (nothing done).`

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(errOut, usage)
		return exitError(2)
	}
	switch args[0] {
	case "sale":
		return runSale(ctx, args[1:], out, errOut)
	case "call", "send":
		return one(ctx, args[0], args[1:], out, errOut)
	case "bulk":
		return bulk(ctx, args[1:], out, errOut)
	case "version", "--version", "-version":
		fmt.Fprintln(out, cmdutil.VersionLine("submit"))
		return nil
	case "-h", "--help", "help":
		fmt.Fprintln(out, usage)
		return nil
	}
	fmt.Fprintf(errOut, "submit: unknown command %q\n%s\n", args[0], usage)
	return exitError(2)
}

// parse parses a command's flags: cmdutil.Parse.
func parse(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	return cmdutil.Parse(fs, args, errOut)
}

// parse parses a command's flags (cmdutil.Parse), then fills what they
// did not give from the --context named, if any.
func (c *common) parse(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	if err := parse(fs, args, errOut); err != nil {
		return err
	}
	return c.auth.UseContext(fs, "nats", &c.url)
}

// usagef is a usage error: exit 2, nothing done.
var usagef = cmdutil.Usagef

type common struct {
	url        string
	namespace  string
	partitions int
	shards     int
	maxBacklog int64
	workers    int
	verbose    bool
	logFormat  string
	auth       *natsflags.Auth
	otlp       *string    // --otlp-endpoint: trace the client's jobs
	nc         *nats.Conn // once connected to --nats: the server's refusals are read from it

	// With --metrics: the observers of the client and the in-process workers.
	clientObs *keylane.ClientObserver
	workerObs *keylane.WorkerObserver
}

// register adds the flags every subcommand takes; embedded adds those of
// the in-process server and workers that only sale can start.
func (c *common) register(fs *flag.FlagSet, embedded bool) {
	natsHelp := "NATS URL, required (env NATS_URL)"
	if embedded {
		natsHelp = "NATS URL; empty starts an embedded server and workers in this process (env NATS_URL)"
	}
	fs.StringVar(&c.url, "nats", os.Getenv("NATS_URL"), natsHelp)
	fs.StringVar(&c.namespace, "namespace", cmdutil.Namespace(), "keylane namespace (env KEYLANE_NAMESPACE)")
	fs.IntVar(&c.partitions, "partitions", 0, "partition count: with --nats it must match the stream's (0 takes it; a client creates no stream, a worker does); without, the in-process workers create the namespace with it (0: 16)")
	fs.IntVar(&c.shards, "stream-shards", 0, "jobs stream shards (0: the namespace's; 1 when creating)")
	if embedded {
		fs.IntVar(&c.workers, "workers", 3, "in-process workers when no --nats is given")
		fs.BoolVar(&c.verbose, "v", false, "log worker events to stderr")
		fs.StringVar(&c.logFormat, "log-format", "text", "with -v: "+cmdutil.LogFormats)
	}
	c.auth = natsflags.Register(fs)
	c.otlp = otlp.Register(fs)
}

// logger is the in-process workers' logger: nil without -v.
func (c *common) logger() (*slog.Logger, error) {
	if !c.verbose {
		return nil, nil
	}
	return cmdutil.NewLogger(os.Stderr, c.logFormat, slog.LevelInfo)
}

// connect returns a client, starting an in-process deployment when no URL
// was given, and a function that tears everything down.
func (c *common) connect(ctx context.Context, hold time.Duration) (*keylane.Client, *sale.Local, func(), error) {
	auth, err := c.auth.Options()
	if err != nil {
		return nil, nil, nil, err
	}
	if c.auth.Set() && c.url == "" {
		return nil, nil, nil, usagef("--creds, --nkey, --user, --password, --tls-* and --inbox-prefix are for a server given with --nats; the in-process deployment runs without them")
	}
	if *c.otlp != "" && c.url == "" {
		return nil, nil, nil, usagef("--otlp-endpoint traces a client of workers given with --nats; the in-process deployment does not trace")
	}
	if *c.otlp != "" {
		if _, err := otlp.Endpoint(*c.otlp); err != nil {
			return nil, nil, nil, &cmdutil.UsageError{Err: err}
		}
	}
	tp, err := otlp.New(*c.otlp, "keylane-submit")
	if err != nil {
		return nil, nil, nil, err
	}
	var tracing trace.TracerProvider // nil unless --otlp-endpoint: a nil *Provider is not a nil interface
	flush := func() {}
	if tp != nil {
		tracing = tp
		flush = func() {
			if err := otlp.Shutdown(tp, 5*time.Second); err != nil {
				fmt.Fprintln(os.Stderr, "submit:", err)
			}
		}
	}
	if c.url != "" {
		nc, err := nats.Connect(c.url, append([]nats.Option{nats.Name("keylane-submit")}, auth...)...)
		if err != nil {
			flush()
			return nil, nil, nil, fmt.Errorf("connect to %s: %w", natsflags.Redact(c.url), err)
		}
		c.nc = nc
		cl, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: c.namespace, Partitions: c.partitions, StreamShards: c.shards, Observer: c.clientObs, TracerProvider: tracing})
		if err != nil {
			err = natsflags.Refused(nc, err) // while nc is open: it may ask the server why
			nc.Close()
			flush()
			return nil, nil, nil, err
		}
		return cl, nil, func() { cl.Close(); nc.Close(); flush() }, nil
	}
	log, err := c.logger()
	if err != nil {
		return nil, nil, nil, err
	}
	local, err := sale.StartLocal(ctx, sale.LocalConfig{
		Workers:  c.workers,
		Topology: keylane.TopologyConfig{Namespace: c.namespace, Partitions: c.partitions, StreamShards: c.shards, MaxKeyBacklog: c.maxBacklog},
		Hold:     hold,
		Logger:   log,

		WorkerObserver: c.workerObs,
		ClientObserver: c.clientObs,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	cl, err := local.Client(ctx)
	if err != nil {
		local.Stop(context.Background())
		return nil, nil, nil, err
	}
	return cl, local, func() {
		cl.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		local.Stop(sctx)
	}, nil
}

func runSale(ctx context.Context, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("sale", flag.ContinueOnError)
	var c common
	c.register(fs, true)
	var cfg sale.Config
	var hold time.Duration
	fs.IntVar(&cfg.SKUs, "skus", 5, "SKUs on sale")
	fs.Int64Var(&cfg.Stock, "stock", 1000, "starting stock of each SKU")
	fs.IntVar(&cfg.Buyers, "buyers", 64, "concurrent buyers")
	fs.IntVar(&cfg.Purchases, "purchases", 10000, "single-unit purchases in all")
	fs.Float64Var(&cfg.Skew, "skew", 1.1, "zipf exponent of demand over SKUs (>1), 0 for even demand")
	fs.BoolVar(&cfg.FireAndForget, "fire-and-forget", false, "submit all purchases with SubmitMany, then wait for the stock")
	fs.DurationVar(&hold, "hold", 0, "pause inside the critical section (in-process workers only)")
	fs.Int64Var(&c.maxBacklog, "max-key-backlog", 0, "in-process workers only: create the namespace with this per-key backlog cap (admission control; purchases beyond it are refused, nothing stored); with --nats the namespace's workers fix it (worker --max-key-backlog)")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound on the whole sale")
	metricsAddr := fs.String("metrics", os.Getenv("KEYLANE_METRICS"), "serve Prometheus metrics at http://ADDR/metrics while the sale runs: the client's, and the in-process workers' (env KEYLANE_METRICS)")
	forceBars := fs.Bool("progress", false, "draw a progress bar on stderr even when it is not a terminal, and from the start (on a terminal it shows once the sale has run 2s)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the sale itself (not the set-up) to FILE; with no --nats it covers the embedded server and workers too")
	if err := c.parse(fs, args, errOut); err != nil {
		return err
	}
	var reg *prometheus.Registry
	if *metricsAddr != "" {
		wm, cm := metrics.NewWorker(), metrics.NewClient()
		c.workerObs, c.clientObs = wm.Observer(), cm.Observer()
		reg = prometheus.NewRegistry()
		reg.MustRegister(wm, cm)
	}
	if c.maxBacklog < 0 || (c.maxBacklog > 0 && c.url != "") {
		return usagef("--max-key-backlog must be 0 or more, and only without --nats: a namespace's workers fix its cap (worker --max-key-backlog)")
	}
	if cfg.Skew == 0 {
		cfg.Even = true
	} else if cfg.Skew <= 1 {
		return usagef("--skew must be above 1, or 0 for even demand")
	}
	cl, local, done, err := c.connect(ctx, hold)
	if err != nil {
		return err
	}
	defer done()
	where := natsflags.Redact(c.url)
	var tr *sale.Tracker
	if local != nil {
		where = fmt.Sprintf("embedded NATS at %s, %d workers in this process", local.URL, len(local.Workers))
		tr = local.Tracker
	}
	fmt.Fprintf(out, "keylane: %s, %d partitions\n", where, cl.Partitions())
	if reg != nil {
		if local != nil {
			for _, w := range local.Workers {
				reg.MustRegister(metrics.New(w))
			}
		}
		addr, stop, err := serveMetrics(*metricsAddr, reg)
		if err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(out, "metrics: http://%s/metrics\n", addr)
	}
	bars := progress.NewAfter(errOut, *forceBars, 2*time.Second)
	purchases := cfg.Purchases
	if purchases == 0 {
		purchases = 10000 // sale.Config's default
	}
	bar := bars.Bar("purchases", int64(purchases))
	var mu sync.Mutex
	most := 0
	cfg.Progress = func(done int) {
		mu.Lock() // buyers answer out of order: the bar only moves on
		defer mu.Unlock()
		if done > most {
			most = done
			bar.Set(int64(done))
		}
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v, err := sale.Run(ctx, cl, cfg, tr)
	runtime.ReadMemStats(&after)
	bars.Wait()
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	v.Print(out)
	if local != nil {
		fmt.Fprintf(out, "  allocations: %.0f per purchase in this process (client, workers and embedded server together)\n",
			float64(after.Mallocs-before.Mallocs)/float64(v.Config.Purchases))
	}
	if local != nil {
		for _, w := range local.Workers {
			s := w.Stats()
			fmt.Fprintf(out, "  worker %s: partitions %v, runs %d, acked %d, retries+failures %d, dead %d\n",
				w.ID(), w.Owned(), s.Runs, s.Succeeded, s.Failed, s.DeadLettered)
		}
	}
	if !v.OK() {
		return exitError(1)
	}
	return nil
}

func one(ctx context.Context, cmd string, args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var c common
	c.register(fs, false)
	key := fs.String("key", "", "resource key (required)")
	payload := fs.String("payload", "", "job payload")
	id := fs.String("id", "", "job ID, the idempotency key (default: a new one)")
	typ := fs.String("type", "", "job type, for workers with a Mux")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait")
	delay := fs.Duration("delay", 0, "send only: the job joins its key's queue this much later (a namespace made with worker --delays)")
	if err := c.parse(fs, args, errOut); err != nil {
		return err
	}
	if c.url == "" {
		return usagef("--nats (or NATS_URL, or --context) is required: start workers with `go run ./cmd/worker` first")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout) // covers opening the namespace, which waits until ctx ends
	defer cancel()
	cl, _, done, err := c.connect(ctx, 0)
	if err != nil {
		return err
	}
	defer done()
	var opts []keylane.SubmitOpt
	if *id != "" {
		opts = append(opts, keylane.WithID(*id))
	}
	if *typ != "" {
		opts = append(opts, keylane.WithType(*typ))
	}
	if *delay != 0 {
		opts = append(opts, keylane.WithDelay(*delay))
	}
	if cmd == "send" {
		jobID, err := cl.Submit(ctx, *key, []byte(*payload), opts...)
		if errors.Is(err, keylane.ErrDuplicate) {
			fmt.Fprintln(out, jobID, "(duplicate: stored before, nothing new stored)")
			return nil
		}
		if err != nil {
			return natsflags.Refused(c.nc, err)
		}
		fmt.Fprintln(out, jobID)
		return nil
	}
	res, err := cl.Call(ctx, *key, []byte(*payload), opts...)
	if err != nil {
		return natsflags.Refused(c.nc, err)
	}
	fmt.Fprintln(out, string(res))
	return nil
}

// serveMetrics serves reg at http://addr/metrics until stop is called, and
// returns the address it listens on.
func serveMetrics(addr string, reg *prometheus.Registry) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// startCPUProfile starts a CPU profile into path (none when empty) and
// returns the function that stops it and closes the file.
func startCPUProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
