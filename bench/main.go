// Command bench compares keylane with its peers in one interleaved run and
// prints a table: keylane Call and Submit, fallback.Do, redsync and
// redislock (default and tuned), and the limits of one atomic Lua script
// and of a bare JetStream stream and consumer, on a hot key, a skewed sale,
// a slow critical section and durable servers.
//
//	bench                         # everything, 3 interleaved runs
//	bench --quick                 # 1 short run of everything
//	bench --only hot,keylane      # the hot-key workloads, keylane's rows
//	bench --markdown --chart hot.png
//
// The Postgres rows set keylane in front of PostgreSQL (keylanepg) beside
// PostgreSQL alone on the hot and skewed sales, durable and not:
//
//	bench --only postgres         # those rows alone
//
// It needs redis-server on PATH (or REDIS_SERVER) and the go command, to
// build the nats-server of the separate placement once (or --nats-server).
// The Postgres rows start a throwaway postgres per run (initdb into a
// temporary directory, a free loopback port); without its binaries (PATH,
// /usr/lib/postgresql/*/bin or PGTEST_BINDIR) they are skipped with a line
// saying so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keylane/keylane/bench/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 {
		// Hidden subcommands: the child processes of the separate placement.
		switch args[0] {
		case "worker", "rawjs":
			fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
			url := fs.String("nats", "", "NATS server URL")
			hold := fs.Duration("hold", 0, "simulated I/O inside the critical section")
			replicas := fs.Int("replicas", 0, "replicas of the namespace when creating it (worker)")
			shards := fs.Int("stream-shards", 0, "jobs stream shards of the namespace when creating it (worker)")
			outcomeBatch := fs.Int("outcome-batch", 0, "WorkerConfig.OutcomeBatch of the workers (worker)")
			if err := fs.Parse(args[1:]); err != nil {
				return errUsage
			}
			out = &lockedWriter{w: out}
			go bench.AnswerAllocs(os.Stdin, out)
			if stop, err := profileTo(args[0]); err != nil {
				return err
			} else {
				defer stop()
			}
			if args[0] == "worker" {
				return bench.ServeWorker(ctx, bench.WorkerOptions{URL: *url, Hold: *hold, Replicas: *replicas, StreamShards: *shards, OutcomeBatch: *outcomeBatch}, out)
			}
			return bench.ServeRawJS(ctx, *url, out)
		}
	}
	if stop, err := profileTo("bench"); err != nil {
		return err
	} else {
		defer stop()
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg bench.Config
	fs.IntVar(&cfg.Runs, "runs", 3, "runs of every workload and contender (the table shows the median)")
	fs.IntVar(&cfg.Purchases, "purchases", 20_000, "at most this many purchases per run")
	fs.DurationVar(&cfg.Duration, "duration", 4*time.Second, "no purchase starts after this long in a run")
	buyers := fs.String("buyers", "8,64,256", "buyer counts of the hot-key workload")
	fs.IntVar(&cfg.SKUs, "skus", 10_000, "SKUs of the skewed and slow workloads")
	fs.Float64Var(&cfg.Skew, "skew", 1.1, "Zipf exponent of their demand")
	fs.DurationVar(&cfg.Hold, "hold", time.Millisecond, "simulated I/O inside the critical section of the slow workload")
	placement := fs.String("placement", "separate,embedded", "where NATS runs: separate (a nats-server process, workers in a child process), embedded (all in this process), cluster (three routed nats-server processes, replicas 3, keylane rows only)")
	shards := fs.String("stream-shards", "1", "jobs stream shard counts the cluster placement compares, comma-separated, e.g. 1,3")
	fs.BoolVar(&cfg.SpreadLeaders, "spread-leaders", true, "cluster placement: move the shards' stream leaders onto different nodes before each run")
	only := fs.String("only", "", "comma-separated substrings: keep only the workloads and contenders (or kinds: keylane, peer, limit) they name")
	quick := fs.Bool("quick", false, "1 run of at most 1000 purchases or 1s each (flags given explicitly win)")
	fs.BoolVar(&cfg.Markdown, "markdown", false, "print the table as Markdown")
	fs.StringVar(&cfg.Chart, "chart", "", "draw jobs/s against buyers of the hot key into this PNG file")
	fs.StringVar(&cfg.NATSServer, "nats-server", "", "nats-server binary for the separate placement (default: built once from the module version, cached)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "bench: unexpected arguments:", fs.Args())
		return errUsage
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["runs"] {
			cfg.Runs = 1
		}
		if !set["purchases"] {
			cfg.Purchases = 1000
		}
		if !set["duration"] {
			cfg.Duration = time.Second
		}
	}
	for _, b := range strings.Split(*buyers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(b))
		if err != nil {
			return fmt.Errorf("--buyers: %w", err)
		}
		cfg.Buyers = append(cfg.Buyers, n)
	}
	for _, s := range strings.Split(*shards, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--stream-shards: %w", err)
		}
		cfg.StreamShards = append(cfg.StreamShards, n)
	}
	for _, p := range strings.Split(*placement, ",") {
		cfg.Placements = append(cfg.Placements, bench.Placement(strings.TrimSpace(p)))
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	cfg.CommandLine = bench.CommandLine(append([]string{"bench"}, args...))
	cfg.Progress = os.Stderr
	return bench.Run(ctx, cfg, out)
}

// lockedWriter serializes writes: a child's "ready" and its answers to
// allocation queries share stdout.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// profileTo starts a CPU profile of this process into
// $KEYLANE_BENCH_CPUPROFILE/<what>-<pid>.pprof when that directory is set:
// the bench process (the buyers and keylane's Client, in the separate and
// cluster placements) and each worker or raw consumer child apart.
func profileTo(what string) (stop func(), err error) {
	dir := os.Getenv("KEYLANE_BENCH_CPUPROFILE")
	if dir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", what, os.Getpid())))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
