package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// header describes the machine, the servers and the settings of a bench.
type header struct {
	separate, embedded, redis bool
	cluster, postgres         bool
	natsVersion               string
	redisVersion              string
	postgresVersion           string
}

func (h *header) print(out io.Writer, cfg *Config) {
	fmt.Fprintf(out, "command: %s\n", cfg.CommandLine)
	fmt.Fprintf(out, "machine: %s, %d cores, Linux %s, %s\n", cpuModel(), runtime.NumCPU(), kernel(), runtime.Version())
	if h.separate {
		fmt.Fprintf(out, "nats-server (separate): %s\n", h.natsVersion)
	}
	if h.cluster {
		leaders := "where the cluster elected them"
		if cfg.SpreadLeaders {
			leaders = "spread before each run (keylane.SpreadLeaders)"
		}
		fmt.Fprintf(out, "cluster: 3 nats-server processes routed on loopback (natscluster.Launch), every keylane object R3, jobs stream shards %v; shard leaders %s; server CPU and MB are the three nodes' sum\n",
			cfg.StreamShards, leaders)
	}
	if h.embedded {
		fmt.Fprintf(out, "nats-server (embedded): v%s, in this process\n", server.VERSION)
	}
	if h.redis {
		fmt.Fprintf(out, "redis-server: %s\n", h.redisVersion)
	}
	if h.postgres {
		fmt.Fprintf(out, "postgres: %s\n", h.postgresVersion)
	}
	fmt.Fprintf(out, "runs: %d, interleaved (every row's run r before any run r+1, order rotated each round); each run at most %d purchases or %s of starting them, whichever first\n",
		cfg.Runs, cfg.Purchases, cfg.Duration)
	fmt.Fprintf(out, "workloads: hot = 1 SKU (stock 3/4 of the purchases); skewed = %d SKUs, zipf s=%.2f, stock %d each; slow = skewed with %s of I/O inside the critical section;\n  skewed-ample = skewed with stock %d each (no SKU sells out: its hot rows stay contended all run), Postgres rows only, fsync\n",
		cfg.SKUs, cfg.Skew, max(1, cfg.Purchases/20), cfg.Hold, cfg.Purchases)
	fmt.Fprintln(out, settings)
	for _, k := range append(slices.Clone(knobs), durationKnobs...) {
		if v := os.Getenv(k); v != "" {
			fmt.Fprintf(out, "EXPERIMENT: %s=%s overrides the setting above\n", k, v)
		}
	}
	fmt.Fprintln(out)
}

// cpuModel returns the first model name in /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
