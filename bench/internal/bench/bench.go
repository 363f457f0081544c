package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/redistest"
)

// Config says what to run. The zero value runs everything with the
// defaults below.
type Config struct {
	// Runs of every workload and contender; the table shows the median.
	// Defaults to 3.
	Runs int
	// Purchases bounds every run by count. Defaults to 20,000.
	Purchases int
	// Duration bounds every run by time: no purchase starts after it.
	// Defaults to 4 s.
	Duration time.Duration
	// Buyers are the buyer counts of the hot-key workload; the durable
	// variant runs at 64 (or the middle count when 64 is not among them).
	// Defaults to 8, 64, 256.
	Buyers []int
	// SKUs of the skewed and slow workloads. Defaults to 10,000.
	SKUs int
	// Skew is their Zipf exponent. Defaults to 1.1.
	Skew float64
	// Hold is the simulated I/O of the slow workload. Defaults to 1 ms.
	Hold time.Duration
	// Placements of NATS to run. Defaults to separate, then embedded.
	Placements []Placement
	// StreamShards are the jobs stream shard counts the cluster placement
	// compares, each its own row. Defaults to 1.
	StreamShards []int
	// SpreadLeaders moves the shards' stream leaders onto different nodes
	// before each cluster run (keylane.SpreadLeaders); otherwise they
	// stay where the cluster elected them.
	SpreadLeaders bool
	// Only keeps the workloads and contenders whose names contain one of
	// these substrings (case-insensitive); a term that names neither is an
	// error. Contenders also match their kind: keylane, peer, limit.
	// Defaults to everything.
	Only []string
	// Markdown prints the table as Markdown.
	Markdown bool
	// Chart, when set, is a PNG file to draw jobs/s against buyers of the
	// hot-key workload in.
	Chart string
	// NATSServer is the nats-server binary of the separate placement.
	// Defaults to one built from the module version this program uses.
	NATSServer string
	// Exe is this program, run with the hidden subcommands "worker" and
	// "rawjs" by the separate placement. Defaults to os.Executable.
	Exe string
	// CommandLine is printed in the header. Defaults to
	// CommandLine(os.Args).
	CommandLine string
	// Progress receives a line per run. Defaults to discarding.
	Progress io.Writer
}

func (c *Config) setDefaults() error {
	if c.Runs == 0 {
		c.Runs = 3
	}
	if c.Purchases == 0 {
		c.Purchases = 20_000
	}
	if c.Duration == 0 {
		c.Duration = 4 * time.Second
	}
	if len(c.Buyers) == 0 {
		c.Buyers = []int{8, 64, 256}
	}
	if c.SKUs == 0 {
		c.SKUs = 10_000
	}
	if c.Skew == 0 {
		c.Skew = 1.1
	}
	if c.Hold == 0 {
		c.Hold = time.Millisecond
	}
	if len(c.Placements) == 0 {
		c.Placements = []Placement{Separate, Embedded}
	}
	if len(c.StreamShards) == 0 {
		c.StreamShards = []int{1}
	}
	for _, s := range c.StreamShards {
		if s < 1 || s > 16 {
			return fmt.Errorf("bench: stream shards must be 1..16 (the partitions), got %d", s)
		}
	}
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.Exe = exe
	}
	if c.CommandLine == "" {
		c.CommandLine = CommandLine(os.Args)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	switch {
	case c.Runs < 0 || c.Purchases < 1 || c.Duration < 0 || c.SKUs < 1 || c.Hold < 0:
		return errors.New("bench: runs, purchases, duration, SKUs and hold must be positive")
	case c.Skew <= 1:
		return fmt.Errorf("bench: zipf skew must be above 1, got %g", c.Skew)
	}
	for _, b := range c.Buyers {
		if b < 1 {
			return fmt.Errorf("bench: bad buyer count %d", b)
		}
	}
	for _, p := range c.Placements {
		if p != Separate && p != Embedded && p != Cluster {
			return fmt.Errorf("bench: unknown placement %q (separate, embedded, cluster)", p)
		}
	}
	return nil
}

// workloads returns the hot key at every buyer count, the skewed and the
// slow sale, and the hot key with durable servers.
func (c *Config) workloads() []Workload {
	hot := Workload{Name: "hot", SKUs: 1, Stock: max(1, int64(c.Purchases)*3/4), Purchases: c.Purchases, Duration: c.Duration}
	var ws []Workload
	for _, b := range c.Buyers {
		hot.Buyers = b
		ws = append(ws, hot)
	}
	skewed := Workload{Name: "skewed", Buyers: 64, SKUs: c.SKUs, Skew: c.Skew, Stock: max(1, int64(c.Purchases)/20), Purchases: c.Purchases, Duration: c.Duration}
	slow := skewed
	slow.Name, slow.Hold = "slow", c.Hold
	durable := hot
	durable.Durable, durable.Buyers = true, c.Buyers[len(c.Buyers)/2]
	for _, b := range c.Buyers {
		if b == 64 {
			durable.Buyers = 64
		}
	}
	skewedDurable := skewed
	skewedDurable.Durable = true
	// The skewed sale sells its hottest SKUs out within the first third
	// of a run; from then on Postgres's conditional UPDATE of them matches
	// no row, takes no lock and commits without a WAL flush, while
	// keylane still records each purchase's outcome. ample keeps every
	// SKU in stock for the whole run, so the hot rows stay contended: the
	// set-up of the pgbench figures issue 19 sets its targets against.
	ample := skewedDurable
	ample.Name, ample.Stock = "skewed-ample", int64(c.Purchases)
	return append(ws, skewed, slow, durable, skewedDurable, ample)
}

// onlyPostgres reports whether w is run by the Postgres rows alone: the
// skewed sales with durable servers, the targets of keylane → Postgres.
func onlyPostgres(w Workload) bool { return w.Durable && w.SKUs > 1 }

// spec is a contender and how the table places it.
type spec struct {
	c Contender
	// nats contenders run once per placement.
	nats bool
	// limit names the row this one is compared with in "% of limit".
	limit string
	// pg contenders sell out of PostgreSQL: they need its binaries, and
	// skip the slow workload (no hold in shop.Sell).
	pg bool
}

func contenders() []spec {
	return []spec{
		{c: &keylaneSale{}, nats: true, limit: rawRR},
		{c: &keylaneSale{submit: true}, nats: true, limit: rawPC},
		{c: &keylaneSale{noIDs: true}, nats: true, limit: rawRR},
		{c: &keylaneSale{submit: true, noIDs: true}, nats: true, limit: rawPC},
		{c: &rawSale{}, nats: true},
		{c: &rawSale{bulk: true}, nats: true},
		{c: &redisSale{name: "fallback.Do", kind: Peer, open: fallbackDo}, limit: luaRow},
		{c: &redisSale{name: "redsync", kind: Peer, open: openRedsync()}, limit: luaRow},
		{c: &redisSale{name: "redsync tuned", kind: Peer, open: openRedsync(redsyncTuned...)}, limit: luaRow},
		{c: &redisSale{name: "redislock", kind: Peer, open: openRedislock(nil)}, limit: luaRow},
		{c: &redisSale{name: "redislock tuned", kind: Peer, open: openRedislock(redislockTuned)}, limit: luaRow},
		{c: &redisSale{name: luaRow, kind: Limit, open: luaLimit}},
		{c: &pgSale{name: pgKeylaneRow}, pg: true},
		{c: &pgSale{name: pgKeylaneRow, noIDs: true}, pg: true},
		{c: &pgSale{name: pgSubmitRow}, pg: true},
		{c: &pgSale{name: pgUpdateRow}, pg: true},
		{c: &pgSale{name: pgForUpdateRow}, pg: true},
	}
}

// settings says how the peers and limits are configured, for the header.
const settings = `keylane: 3 workers and inventory handler as sale.StartLocal runs them, 16 partitions; Call = request-reply,
  Submit = SubmitMany then wait until the stream is empty; with fsync the workers keep outcomes in atomic batches of 16 or more (WorkerConfig.OutcomeBatch, as advised for a server that syncs always);
  every purchase has its caller's ID, its order ID (WithID, Request.ID), as a shop sends it, keylane → Postgres rows too; ", no IDs" rows: a variant where keylane names the jobs
  (no caller's ID: nothing to look up before a job runs, a Call's outcome kept in its batch's entry); every job on the one path (batch messages)
fallback.Do: defaults (blocked waiters wake on a pub/sub unlock notification, 10-500 ms backoff net)
redsync: defaults (32 tries, 50-250 ms random delay); after ErrFailed the harness calls Lock again
redsync tuned: WithTries(100000), exponential backoff with full jitter: delay uniform in [0, min(32 ms, 1 ms * 2^try))
redislock: default NoRetry; the harness calls Obtain again at once (a spin: see lock calls/op)
redislock tuned: ExponentialBackoff(1 ms, 32 ms): 4, 8, 16, 32, 32... ms
locks: GET stock, (hold), SET stock-1 if > 0, under the SKU's lock; go-redis pool of buyers+8 connections
limits (not ranked): Lua EVALSHA = one atomic check-and-decrement script per purchase, no lock;
  raw JS = one stream, one pull consumer, an in-memory counter, no keylane (request-reply: reply header, reply then ack;
  publish+consume: async publish, ack, wait until the stream is empty); limits skip the slow workload (no hold)
fsync: nats sync_interval always, redis appendonly yes + appendfsync always; otherwise nats default sync, redis appendonly no
Postgres rows: a throwaway postgres per run (pgtest: initdb, 127.0.0.1, max_connections=300, shared_buffers=256MB, fsync on),
  synchronous_commit=on with fsync, off otherwise; tables stock(sku, n) and orders(sku, job_id), one order row per unit sold (checked);
  keylane → Postgres: embedded NATS (fsync: sync always), 1 partition (64 keys at once), 3 workers in this process, keylanepg.Applier with
  shop.SellSet (a partition's ready keys in one transaction of at most 64 jobs: their stock rows read FOR UPDATE in the first
  round trip, the sale decided in Go, the stock and order rows written with one statement each in the second, with the record
  and COMMIT: 2 round trips and 9 statements a transaction whatever its jobs; KEYLANE_BENCH_PG_SET=0: shop.SellPipeline, a statement a job), Calls with
  order IDs (", no IDs": keylane names the jobs), in batch messages (with fsync the clients cork a busy partition's batch 1ms: ClientConfig.BatchCork)
  (Submit: SubmitMany with order IDs, then wait until the stream is empty);
  Postgres UPDATE: UPDATE stock SET n = n-1 WHERE sku = $1 AND n > 0, no order row; Postgres FOR UPDATE tx: BEGIN; SELECT n … FOR UPDATE;
  UPDATE; INSERT order; COMMIT; both a pool connection per buyer; the skewed fsync sales run the Postgres rows only; server CPU not measured`

// entry is one row of the table: a contender in a placement ("" for Redis)
// under a workload.
type entry struct {
	w         Workload
	s         spec
	placement Placement
	shards    int // jobs stream shards of the cluster placement; 0 elsewhere
	results   []Result
}

// where names the entry's placement, with its shards in the cluster.
func (e *entry) where() string {
	switch {
	case e.shards == 1:
		return string(e.placement) + ", 1 shard"
	case e.shards > 1:
		return fmt.Sprintf("%s, %d shards", e.placement, e.shards)
	}
	return string(e.placement)
}

func (e *entry) id() string {
	id := e.w.Label() + " | " + e.s.c.Name()
	if e.placement != "" {
		id += " (" + e.where() + ")"
	}
	return id
}

// plan returns the rows to run, in table order, after the Only filter.
func (c *Config) plan() ([]*entry, error) {
	ws, ss := c.workloads(), contenders()
	wantW := make([]bool, len(ws))
	wantS := make([]bool, len(ss))
	anyW, anyS := false, false
	for _, term := range c.Only {
		t, hit := strings.ToLower(strings.TrimSpace(term)), false
		for i, w := range ws {
			if strings.Contains(strings.ToLower(w.Label()), t) {
				wantW[i], anyW, hit = true, true, true
			}
		}
		for i, s := range ss {
			if strings.Contains(strings.ToLower(s.c.Name()+" "+kindName(s.c.Kind())), t) {
				wantS[i], anyS, hit = true, true, true
			}
		}
		if !hit {
			return nil, fmt.Errorf("bench: --only %q names no workload or contender", term)
		}
	}
	var plan []*entry
	for i, w := range ws {
		if anyW && !wantW[i] {
			continue
		}
		for j, s := range ss {
			if (anyS && !wantS[j]) || (s.c.Kind() == Limit && w.Hold > 0) || (s.pg && w.Hold > 0) || (!s.pg && onlyPostgres(w)) {
				continue
			}
			if !s.nats {
				plan = append(plan, &entry{w: w, s: s})
				continue
			}
			for _, p := range c.Placements {
				if p != Cluster {
					plan = append(plan, &entry{w: w, s: s, placement: p})
					continue
				}
				if s.c.Kind() != Keylane || w.Durable {
					continue
				}
				for _, n := range c.StreamShards {
					plan = append(plan, &entry{w: w, s: s, placement: p, shards: n})
				}
			}
		}
	}
	if len(plan) == 0 {
		return nil, errors.New("bench: nothing to run")
	}
	return plan, nil
}

// CommandLine returns args as a shell command line: the program's base
// name, then the arguments, quoted where a shell would need it.
func CommandLine(args []string) string {
	if len(args) == 0 {
		return ""
	}
	out := []string{filepath.Base(args[0])}
	for _, a := range args[1:] {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]{}();&|<>#~!") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

func kindName(k Kind) string {
	return [...]string{Keylane: "keylane", Peer: "peer", Limit: "limit"}[k]
}

// ErrBroken is returned by Run when a row broke the sale's invariant or a
// run failed.
var ErrBroken = errors.New("bench: a contender broke the invariant or failed")

// Run runs the plan, interleaved, and prints the header and the table to
// out (and draws the chart). It returns ErrBroken after printing if any
// row is not ok.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	if err := checkKnobs(); err != nil {
		return err
	}
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	plan, err := cfg.plan()
	if err != nil {
		return err
	}
	if plan, err = withoutPostgres(plan, out); err != nil {
		return err
	}
	h, err := prepare(ctx, &cfg, plan)
	if err != nil {
		return err
	}
	h.print(out, &cfg)
	byWorkload := map[string][]*entry{}
	var order []string
	for _, e := range plan {
		l := e.w.Label()
		if byWorkload[l] == nil {
			order = append(order, l)
		}
		byWorkload[l] = append(byWorkload[l], e)
	}
	total, n := cfg.Runs*len(plan), 0
	for r := range cfg.Runs {
		for _, l := range order {
			es := byWorkload[l]
			k := r * len(es) / cfg.Runs // rotate the order every round
			for _, e := range append(es[k:len(es):len(es)], es[:k]...) {
				if err := ctx.Err(); err != nil {
					return err
				}
				n++
				res := runOnce(ctx, &cfg, e)
				e.results = append(e.results, res)
				fmt.Fprintf(cfg.Progress, "[%d/%d] run %d %s: %.0f jobs/s p99 %s %s%s\n", n, total, r+1, e.id(), res.Rate(), fmtDur(res.P99), res.Check(), errSuffix(res))
			}
		}
	}
	rows := summarize(plan)
	printTable(out, rows, cfg.Markdown)
	if cfg.Chart != "" {
		if err := drawChart(cfg.Chart, rows); err != nil {
			return err
		}
		fmt.Fprintf(out, "\nchart: %s\n", cfg.Chart)
	}
	for _, r := range rows {
		if !r.ok {
			return ErrBroken
		}
	}
	return nil
}

func errSuffix(r Result) string {
	switch {
	case r.Err != nil:
		return ": " + r.Err.Error()
	case r.FirstErr != "":
		return " (first error: " + r.FirstErr + ")"
	}
	return ""
}

// runOnce sets the contender up for e's workload and placement, runs it
// and tears it down.
func runOnce(ctx context.Context, cfg *Config, e *entry) Result {
	env := Env{Placement: e.placement, Durable: e.w.Durable, Hold: e.w.Hold, Exe: cfg.Exe, NATSServer: cfg.NATSServer,
		StreamShards: e.shards, SpreadLeaders: cfg.SpreadLeaders, Progress: cfg.Progress}
	c := e.s.c
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		c.Teardown(tctx)
	}()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := c.Setup(sctx, env)
	cancel()
	if err != nil {
		return Result{Err: fmt.Errorf("setup: %w", err)}
	}
	res, err := c.Run(ctx, e.w)
	if err != nil {
		res.Err = err
	}
	return res
}

// prepare finds the servers the plan needs and fails early, and clearly,
// when one is missing.
func prepare(ctx context.Context, cfg *Config, plan []*entry) (*header, error) {
	h := &header{}
	for _, e := range plan {
		if e.placement == Separate || e.placement == Cluster {
			h.separate = true
		}
		if e.placement == Cluster {
			h.cluster = true
		}
		if e.placement == Embedded {
			h.embedded = true
		}
		switch {
		case e.s.pg:
			h.postgres = true
		case !e.s.nats:
			h.redis = true
		}
	}
	if h.separate && cfg.NATSServer == "" {
		bin, err := natsServerBinary(ctx)
		if err != nil {
			return nil, err
		}
		cfg.NATSServer = bin
	}
	if h.redis {
		bin := redistest.Binary()
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("bench: the Redis contenders need redis-server (apt-get install redis-server, or set REDIS_SERVER; or leave them out with --only): %w", err)
		}
		h.redisVersion = binaryVersion(bin)
	}
	if h.separate {
		h.natsVersion = binaryVersion(cfg.NATSServer) + " (" + cfg.NATSServer + ")"
	}
	if h.postgres {
		dir, _ := pgAvailable() // withoutPostgres kept the rows: it is there
		h.postgresVersion = binaryVersion(filepath.Join(dir, "postgres")) + " (" + dir + ")"
	}
	return h, nil
}

// withoutPostgres drops the Postgres rows, saying so on out, when
// postgres's binaries are not installed.
func withoutPostgres(plan []*entry, out io.Writer) ([]*entry, error) {
	_, err := pgAvailable()
	if err == nil {
		return plan, nil
	}
	kept := plan[:0:0]
	for _, e := range plan {
		if !e.s.pg {
			kept = append(kept, e)
		}
	}
	if len(kept) < len(plan) {
		fmt.Fprintf(out, "Postgres rows skipped: %v\n", err)
	}
	if len(kept) == 0 {
		return nil, errors.New("bench: nothing to run")
	}
	return kept, nil
}
