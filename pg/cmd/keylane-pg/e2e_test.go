package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/proctest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/pg/pgtest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// nodeClientDir is the Node client's package, @keylane/client.
const nodeClientDir = "../../../clients/node"

// needNode returns the paths of node and npm, or skips (fails under CI,
// where scripts/test installs both).
func needNode(t *testing.T) (node, npm string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		npm, err = exec.LookPath("npm")
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI=%s and no node or npm on the PATH: scripts/test installs them (apt-get install nodejs npm): %v", os.Getenv("CI"), err)
		}
		t.Skipf("no node or npm on the PATH: %v", err)
	}
	return node, npm
}

// command runs name in dir, bounded, and fails the test with its output
// if it fails.
func command(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// buildNodeClient installs the client's dependencies when node_modules is
// missing (npm ci, from its package-lock.json) and compiles it.
func buildNodeClient(t *testing.T, npm string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(nodeClientDir, "node_modules")); errors.Is(err, os.ErrNotExist) {
		command(t, nodeClientDir, npm, "ci", "--no-audit", "--no-fund")
	}
	command(t, nodeClientDir, npm, "run", "build")
}

// nodeService makes a directory holding script with @keylane/client
// installed beside it (a link to the package, as `npm install
// ../clients/node` makes), so that it imports the client by its name.
func nodeService(t *testing.T, script string) string {
	t.Helper()
	dir := t.TempDir()
	client, err := filepath.Abs(nodeClientDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "node_modules", "@keylane"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(client, filepath.Join(dir, "node_modules", "@keylane", "client")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(script)), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shop starts a real PostgreSQL with the example's schema and a pool on
// it.
func shop(t *testing.T) (*pgtest.Server, *pgxpool.Pool) {
	t.Helper()
	s := pgtest.Start(t)
	pool, err := pgxpool.New(context.Background(), s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema, err := os.ReadFile("example/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), string(schema)); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

// answer is one line of testdata/shop.mjs.
type answer struct {
	ID, SKU   string
	Result    json.RawMessage
	Error     string
	Retry     bool
	Bad       string
	Permanent bool
	Restock   string
	Stock     string
}

type sale struct {
	Sold bool
	Left int64
}

// TestNodeSellsFromPostgres is issue 30's deployable worker end to end: a
// Node service with @keylane/client (testdata/shop.mjs, no Go) sells from
// PostgreSQL through two keylane-pg processes built from this module,
// joined to a nats-server and a database that exist before them, with
// example/shop.json's statements ("buy" a set type). Verdict, against the
// database's rows: every purchase answered; no SKU oversold; each SKU's
// stock its start less the purchases answered sold; the orders table
// exactly those purchases' order IDs, one row each; each sold answer of a
// SKU a distinct stock left; a retry by order ID answered as the first
// call was, from the record, selling nothing more; a payload without its
// field and a type the file lacks refused for good; the stock query
// answering the database's stock.
func TestNodeSellsFromPostgres(t *testing.T) {
	node, npm := needNode(t)
	buildNodeClient(t, npm)
	bin := proctest.Build(t, ".", "keylane-pg")
	pg, pool := shop(t)
	ns := natstest.Start(t)
	const namespace = "shop"
	for _, id := range []string{"pg-1", "pg-2"} {
		proctest.Start(t, bin, "--nats", ns.ClientURL(), "--namespace", namespace, "--partitions", "4", "--lease-ttl", "4s",
			"--postgres", pg.URL("postgres", "postgres")+"&pool_max_conns=8", "--sql", "example/shop.json", "--id", id)
	}

	skus := []string{"sku-1", "sku-2", "sku-3"}
	const start, buyers, purchases, retries = 30, 8, 15, 5 // demand 120 of a stock of 90
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "shop.mjs")
	cmd.Dir = nodeService(t, "testdata/shop.mjs")
	cmd.Env = append(os.Environ(), "KEYLANE_NATS_URL="+ns.ClientURL(), "KEYLANE_NAMESPACE="+namespace, "SKUS="+strings.Join(skus, ","),
		"START="+strconv.Itoa(start), "BUYERS="+strconv.Itoa(buyers), "PURCHASES="+strconv.Itoa(purchases), "RETRIES="+strconv.Itoa(retries))
	var stderr proctest.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node shop.mjs: %v\n%s\n%s", err, stdout, stderr.String())
	}

	var buys, again, bad, stock []answer
	s := bufio.NewScanner(bytes.NewReader(stdout))
	for s.Scan() {
		var a answer
		if err := json.Unmarshal(s.Bytes(), &a); err != nil {
			t.Fatalf("shop.mjs printed %q: %v", s.Text(), err)
		}
		switch {
		case a.Restock != "":
			if string(a.Result) != fmt.Sprintf(`{"n":%d}`, start) {
				t.Errorf("restock %s answered %s", a.Restock, a.Result)
			}
		case a.Retry:
			again = append(again, a)
		case a.Bad != "":
			bad = append(bad, a)
		case a.Stock != "":
			stock = append(stock, a)
		default:
			buys = append(buys, a)
		}
	}
	if len(buys) != buyers*purchases {
		t.Fatalf("%d purchases answered, want %d", len(buys), buyers*purchases)
	}

	// The buyers' answers against the rows.
	first := map[string]string{}
	soldIDs := map[string][]string{}
	lefts := map[string]map[int64]string{}
	for _, a := range buys {
		first[a.ID] = string(a.Result)
		var r sale
		if a.Error != "" || json.Unmarshal(a.Result, &r) != nil {
			t.Errorf("purchase %s of %s: %s%s", a.ID, a.SKU, a.Error, a.Result)
			continue
		}
		if !r.Sold {
			continue
		}
		soldIDs[a.SKU] = append(soldIDs[a.SKU], a.ID)
		if lefts[a.SKU] == nil {
			lefts[a.SKU] = map[int64]string{}
		}
		if other, dup := lefts[a.SKU][r.Left]; dup || r.Left < 0 || r.Left >= start {
			t.Errorf("%s: purchase %s left %d (and %q too): a sale counted twice or out of range", a.SKU, a.ID, r.Left, other)
		}
		lefts[a.SKU][r.Left] = a.ID
	}
	total := 0
	for _, sku := range skus {
		var n int64
		var orders []string
		if err := pool.QueryRow(ctx, `SELECT n, coalesce((SELECT array_agg(order_id ORDER BY order_id) FROM orders WHERE sku = $1 AND qty = 1), '{}') FROM stock WHERE sku = $1`, sku).Scan(&n, &orders); err != nil {
			t.Fatal(err)
		}
		sold := soldIDs[sku]
		total += len(sold)
		if n < 0 || len(sold) > start || n != int64(start-len(sold)) {
			t.Errorf("%s: stock %d, %d answered sold of %d: want stock = start - sold", sku, n, len(sold), start)
		}
		if got, want := strings.Join(orders, " "), strings.Join(sorted(sold), " "); got != want {
			t.Errorf("%s: order rows %q, want exactly the purchases answered sold %q", sku, got, want)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != total || total != start*len(skus) {
		t.Errorf("%d order rows, %d answered sold; want all %d units sold (demand was above the stock)", rows, total, start*len(skus))
	}

	// A retry by order ID: the first answer, from the record.
	if len(again) != 2*retries {
		t.Errorf("%d retries answered, want %d", len(again), 2*retries)
	}
	for _, a := range again {
		if a.Error != "" || string(a.Result) != first[a.ID] {
			t.Errorf("retry of %s answered %s%s, first %s", a.ID, a.Error, a.Result, first[a.ID])
		}
		var recorded string
		if err := pool.QueryRow(ctx, `SELECT convert_from(result, 'UTF8') FROM keylane_outcomes WHERE namespace = $1 AND job_id = $2`, namespace, a.ID).Scan(&recorded); err != nil || recorded != first[a.ID] {
			t.Errorf("order %s's record: %q, %v; want its answer %s", a.ID, recorded, err, first[a.ID])
		}
	}

	// Bad jobs fail for good, saying why.
	says := map[string]string{"missing field": "lacks field(s) qty", "unknown type": `type "sell" is not in the SQL file`}
	if len(bad) != len(says) {
		t.Errorf("bad jobs answered: %+v", bad)
	}
	for _, a := range bad {
		if !a.Permanent || !strings.Contains(a.Error, says[a.Bad]) {
			t.Errorf("%s: %s%s, permanent %v; want a permanent error saying %q", a.Bad, a.Error, a.Result, a.Permanent, says[a.Bad])
		}
	}

	// The stock query reads the rows.
	for _, a := range stock {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT n FROM stock WHERE sku = $1`, a.Stock).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if string(a.Result) != fmt.Sprintf(`{"n":%d}`, n) {
			t.Errorf("stock of %s answered %s, the row says %d", a.Stock, a.Result, n)
		}
	}
	if len(stock) != len(skus) {
		t.Errorf("%d stock answers, want %d", len(stock), len(skus))
	}
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// TestBadFileExitsTwo: a SQL file with faults (an unknown parameter, SQL
// the server will not prepare) stops keylane-pg at start with exit 2 and
// every fault named; nothing runs: no keylane table in the database, no
// namespace on the NATS server.
func TestBadFileExitsTwo(t *testing.T) {
	bin := proctest.Build(t, ".", "keylane-pg")
	pg, pool := shop(t)
	ns := natstest.Start(t)
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"jobs": {
		"buy": {"fields": ["qty"], "statements": ["UPDATE stock SET n = n - :qty WHERE sku = :job.key"], "result": "none"},
		"typo": {"fields": ["qty"], "statements": ["UPDATE stok SET n = n - :qty WHERE sku = :job.key"], "result": "none"}
	}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		file string
		says []string
	}{
		{"unknown parameter", "testdata/unknownparam.json", []string{`job type "buy": statement 1: unknown parameter :qtty`}},
		{"bad SQL", bad, []string{`job type "typo": statement 1: the server will not prepare it: ERROR: relation "stok" does not exist`}},
		{"no file", "testdata/none.json", []string{"--sql: open testdata/none.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "--nats", ns.ClientURL(), "--namespace", "shop", "--postgres", pg.URL("postgres", "postgres"), "--sql", tc.file)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("keylane-pg: %v; want exit 2\n%s", err, out)
			}
			for _, s := range tc.says {
				if !strings.Contains(string(out), s) {
					t.Errorf("output does not say %q:\n%s", s, out)
				}
			}
		})
	}
	var tables int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'keylane%'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d keylane tables created by a refused start", tables)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := js.StreamNames(context.Background())
	for n := range names.Name() {
		t.Errorf("stream %s made by a refused start", n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}
