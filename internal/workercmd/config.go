// Package workercmd is the worker command: its flags and environment, and
// its run, from the embedded server to the graceful drain. cmd/worker runs
// it as it is; the e2e tests' worker adds test-only flags around it.
package workercmd

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/internal/otlp"
	"github.com/nats-io/nats.go"
)

// Config is what the worker command runs, as Parse reads it from flags and
// the environment.
type Config struct {
	// URL of the NATS server(s), comma-separated; empty starts an embedded
	// server on Listen with its store in Data.
	URL, Listen, Data string
	// SyncAlways makes the embedded server fsync every write.
	SyncAlways bool
	// Ping is how often the connection checks the server.
	Ping time.Duration
	// Drain bounds a graceful stop.
	Drain time.Duration
	// Metrics, when set, is the address to serve Prometheus metrics (at
	// /metrics) and the status page (at /, package statuspage) on.
	Metrics string
	// OTLPEndpoint, when set, is the collector URL the worker's trace
	// spans are sent to over OTLP/HTTP (package otlp).
	OTLPEndpoint string
	// Auth holds the credential and TLS options for --nats, from the
	// natsflags flags; nil when none were given.
	Auth []nats.Option
	// Worker is the worker's configuration. Parse sets its ID (a default
	// one if none was given) and Logger; Run defaults its Reducer to the
	// inventory handler when none of Reducer, Handler and Applier is set.
	Worker keylane.WorkerConfig
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

// envName finds the variable a flag's help names: "(env NAME" or
// "(env NAME=1".
var envName = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)`)

// applyEnv sets every flag not given on the command line from the
// variable its help names, through the flag's own parser: a value the
// flag would refuse (KEYLANE_LEASE_TTL=10, KEYLANE_SYNC_ALWAYS=yes) is an
// error naming the variable, never silently the default. The defaults
// read from the environment above only show in -h.
func applyEnv(fs *flag.FlagSet) error {
	given := setFlags(fs)
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		m := envName.FindStringSubmatch(f.Usage)
		if given[f.Name] || m == nil {
			return
		}
		if v := os.Getenv(m[1]); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q (for --%s): %w", m[1], v, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// UsageError is a command line that Parse refused: a bad flag or value.
// The command exits 2 for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Parse registers the worker's flags on fs, next to any fs already has,
// parses args and returns the Config, with a logger to stderr in the
// format (text or json) and at the level asked for. A refused command line is a *UsageError; -h is
// flag.ErrHelp, as fs.Parse returns it.
func Parse(fs *flag.FlagSet, args []string) (Config, error) {
	c, err := parse(fs, args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		err = &UsageError{err}
	}
	return c, err
}

func parse(fs *flag.FlagSet, args []string) (Config, error) {
	var c Config
	var logLevel, logFormat string
	fs.StringVar(&c.URL, "nats", os.Getenv("NATS_URL"), "NATS URL(s), comma-separated; empty starts an embedded server (env NATS_URL)")
	fs.StringVar(&c.Listen, "listen", env("KEYLANE_LISTEN", "127.0.0.1:4222"), "embedded server address (env KEYLANE_LISTEN)")
	fs.StringVar(&c.Data, "data", env("KEYLANE_DATA", "keylane-data"), "embedded server store directory (env KEYLANE_DATA)")
	fs.BoolVar(&c.SyncAlways, "sync-always", os.Getenv("KEYLANE_SYNC_ALWAYS") == "1", "embedded server fsyncs every write (env KEYLANE_SYNC_ALWAYS=1)")
	fs.StringVar(&c.Worker.Topology.Namespace, "namespace", env("KEYLANE_NAMESPACE", "keylane"), "namespace (env KEYLANE_NAMESPACE)")
	fs.IntVar(&c.Worker.Topology.Partitions, "partitions", envInt("KEYLANE_PARTITIONS", 0), "partitions: 0 takes the stream's, or 16 when creating (env KEYLANE_PARTITIONS)")
	fs.IntVar(&c.Worker.Topology.StreamShards, "stream-shards", envInt("KEYLANE_STREAM_SHARDS", 0), "jobs streams the partitions spread over (partition p in shard p % S), so several stream leaders share the storage work: 0 takes the namespace's, or 1 when creating; another count than the namespace's is refused (env KEYLANE_STREAM_SHARDS)")
	fs.IntVar(&c.Worker.Topology.Replicas, "replicas", envInt("KEYLANE_REPLICAS", -1), "replicas of streams and buckets when creating them; an existing namespace with another count is refused. Default: 3 when --nats names more than one server (a cluster), else what exists, or 1 when creating (env KEYLANE_REPLICAS)")
	fs.Int64Var(&c.Worker.Topology.MaxKeyBacklog, "max-key-backlog", int64(envInt("KEYLANE_MAX_KEY_BACKLOG", 0)), "admission control: at most this many jobs of one key waiting or running; the next submit of that key is refused (ErrKeyBacklogFull) and stores nothing. Fixed when the namespace is created: 0 takes the namespace's, or no cap when creating; another cap than the namespace's is refused (env KEYLANE_MAX_KEY_BACKLOG)")
	fs.BoolVar(&c.Worker.Topology.Delays, "delays", os.Getenv("KEYLANE_DELAYS") == "1", "create the namespace taking delayed jobs (WithDelay, WithRunAt; nats-server 2.12+); not with --max-key-backlog. Fixed when the namespace is created (env KEYLANE_DELAYS=1)")
	fs.DurationVar(&c.Ping, "ping-interval", envDur("KEYLANE_PING_INTERVAL", 2*time.Second), "how often the connection checks the server; a worker on a paused or cut-off node notices within two of these (env KEYLANE_PING_INTERVAL)")
	fs.DurationVar(&c.Worker.Topology.LeaseTTL, "lease-ttl", envDur("KEYLANE_LEASE_TTL", 10*time.Second), "partition lease TTL (env KEYLANE_LEASE_TTL)")
	fs.StringVar(&c.Worker.Topology.ReplyPrefix, "reply-prefix", env("KEYLANE_REPLY_PREFIX", ""), "the only subject prefix workers reply to, fixed when the namespace is created: empty takes the namespace's, or "+keylane.DefaultReplyPrefix+" when creating; another than the namespace's is refused. Give each namespace its own (e.g. _INBOX.a.) when NATS permissions keep namespaces apart (env KEYLANE_REPLY_PREFIX)")
	fs.IntVar(&c.Worker.Concurrency, "concurrency", envInt("KEYLANE_CONCURRENCY", 8), "keys of one partition run at once (env KEYLANE_CONCURRENCY)")
	fs.IntVar(&c.Worker.MaxInFlight, "max-in-flight", envInt("KEYLANE_MAX_IN_FLIGHT", 1024), "fetched, unfinished jobs per partition (env KEYLANE_MAX_IN_FLIGHT)")
	fs.IntVar(&c.Worker.MaxDeliver, "max-deliver", envInt("KEYLANE_MAX_DELIVER", 0), "attempts before dead-lettering, the namespace's: 0 takes it, or 5 when no worker fixed it yet; another than the namespace's is refused (env KEYLANE_MAX_DELIVER)")
	fs.DurationVar(&c.Worker.AckWait, "ack-wait", envDur("KEYLANE_ACK_WAIT", 30*time.Second), "server redelivery timeout (env KEYLANE_ACK_WAIT)")
	fs.IntVar(&c.Worker.OutcomeBatch, "outcome-batch", envInt("KEYLANE_OUTCOME_BATCH", 0), "fewest kept outcomes (a group's, with the partition's groups that finish meanwhile) sent to the results bucket as one atomic batch; 0: 2 on a replicated namespace, none on one replica (16 pays there only with sync_interval always, the default with --sync-always); negative: never (env KEYLANE_OUTCOME_BATCH)")
	fs.IntVar(&c.Worker.StateBatch, "state-batch", envInt("KEYLANE_STATE_BATCH", 0), "coalesce the state writes of a partition's keys that finish together into one atomic batch: positive on; 0 or negative off, the default (it did not pay in the bench; env KEYLANE_STATE_BATCH)")
	fs.BoolVar(&c.Worker.StoreResults, "results", os.Getenv("KEYLANE_RESULTS") == "1", "store results in the results bucket (env KEYLANE_RESULTS=1)")
	fs.StringVar(&c.Worker.ID, "id", os.Getenv("KEYLANE_WORKER_ID"), "worker ID (default host-pid-random; env KEYLANE_WORKER_ID)")
	fs.DurationVar(&c.Drain, "drain", envDur("KEYLANE_DRAIN", 30*time.Second), "how long a graceful stop may take (env KEYLANE_DRAIN)")
	fs.StringVar(&c.Metrics, "metrics", os.Getenv("KEYLANE_METRICS"), "serve Prometheus metrics at http://ADDR/metrics and a status page at http://ADDR/ (JSON: /status.json), e.g. 127.0.0.1:9464; it shows keys, job IDs and errors, so keep it on a loopback or private address (env KEYLANE_METRICS)")
	auth := natsflags.Register(fs)
	otlpEndpoint := otlp.Register(fs)
	fs.StringVar(&logLevel, "log-level", env("KEYLANE_LOG_LEVEL", "info"), "debug, info, warn or error; debug adds a line per job event: received, ran, committed, acked (env KEYLANE_LOG_LEVEL)")
	fs.StringVar(&logFormat, "log-format", env("KEYLANE_LOG_FORMAT", "text"), cmdutil.LogFormats+" (env KEYLANE_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := applyEnv(fs); err != nil {
		return c, err
	}
	if c.SyncAlways && c.URL == "" && !setFlags(fs)["outcome-batch"] { // applyEnv sets flags from the environment too
		// The embedded server syncs every write: one fsync per group's
		// outcomes instead of one per job pays there (WorkerConfig.OutcomeBatch).
		c.Worker.OutcomeBatch = keylane.SyncAlwaysOutcomeBatch
	}
	if c.OTLPEndpoint = *otlpEndpoint; c.OTLPEndpoint != "" {
		if _, err := otlp.Endpoint(c.OTLPEndpoint); err != nil {
			return c, err
		}
	}
	if err := auth.UseContext(fs, "nats", &c.URL); err != nil {
		return c, err
	}
	if auth.Set() && c.URL == "" {
		return c, errors.New("--creds, --nkey, --user, --password, --tls-* and --inbox-prefix are for a server given with --nats; the embedded server runs without them")
	}
	opts, err := auth.Options()
	if err != nil {
		return c, err
	}
	c.Auth = opts
	if c.Worker.Topology.MaxKeyBacklog < 0 {
		return c, fmt.Errorf("--max-key-backlog must be 0 (no cap, or the namespace's) or more, got %d", c.Worker.Topology.MaxKeyBacklog)
	}
	if c.Worker.Topology.Delays && c.Worker.Topology.MaxKeyBacklog > 0 {
		return c, errors.New("--delays and --max-key-backlog cannot be combined: the server refuses message schedules on a stream that discards new jobs")
	}
	if c.Worker.Topology.Replicas < 0 {
		c.Worker.Topology.Replicas = 0 // follow the namespace, 1 when creating
		if strings.Count(c.URL, ",") > 0 {
			c.Worker.Topology.Replicas = 3 // a cluster
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--ping-interval", c.Ping},
		{"--drain", c.Drain},
		{"--lease-ttl", c.Worker.Topology.LeaseTTL},
		{"--ack-wait", c.Worker.AckWait},
	} {
		if d.v <= 0 {
			return c, fmt.Errorf("%s must be positive, got %s", d.flag, d.v)
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return c, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	log, err := cmdutil.NewLogger(os.Stderr, logFormat, level)
	if err != nil {
		return c, err
	}
	c.Worker.Logger = log
	if c.Worker.ID == "" {
		c.Worker.ID = keylane.DefaultWorkerID() // known before a handler that names its worker needs it
	}
	return c, nil
}

// setFlags returns the names of the flags set so far (on the command
// line, or from the environment once applyEnv ran).
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
