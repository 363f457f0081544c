// Package nodeclient_test runs the Node.js client's tests (clients/node,
// node's own test runner) against a real in-process nats-server and real
// Go workers, and a mixed sale of Node and Go buyers on the same SKUs.
// Without node and npm on the PATH the tests skip, unless CI is set:
// then they fail (scripts/test installs both).
package nodeclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/faultproxy"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// needNode returns the paths of node and npm, or skips (fails under CI).
// KEYLANE_NODE, when set, names the node that runs the tests (e.g. the
// package's minimum, Debian 12's node 18); npm and the TypeScript build
// run under the PATH's node either way.
func needNode(t *testing.T) (node, npm string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if n := os.Getenv("KEYLANE_NODE"); n != "" {
		node = n
	}
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

var (
	buildOnce sync.Once
	buildErr  error
)

// build installs the package's dependencies when node_modules is missing
// (npm ci, from package-lock.json) and compiles the TypeScript, once per
// test process.
func build(t *testing.T, npm string) {
	t.Helper()
	buildOnce.Do(func() {
		if _, err := os.Stat("node_modules"); errors.Is(err, os.ErrNotExist) {
			if buildErr = run(t, nil, npm, "ci", "--no-audit", "--no-fund"); buildErr != nil {
				return
			}
		}
		buildErr = run(t, nil, npm, "run", "build")
	})
	if buildErr != nil {
		t.Fatalf("building the Node client: %v", buildErr)
	}
}

// run runs a command in this directory with env added, bounded, and logs
// its output line by line.
func run(t *testing.T, env []string, name string, args ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	logLines(t, filepath.Base(name), out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

func logLines(t *testing.T, who string, r io.Reader) {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		t.Logf("%s: %s", who, s.Text())
	}
}

// logWriter logs what is written to it, a line at a time.
type logWriter struct {
	t   *testing.T
	who string
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Logf("%s: %s", w.who, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

// startSale starts an embedded server and two inventory workers (the
// reducer) on a namespace, and stops them when the test ends.
func startSale(t *testing.T, ns string) *sale.Local {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := sale.StartLocal(ctx, sale.LocalConfig{
		Workers:  2,
		Topology: keylane.TopologyConfig{Namespace: ns, Partitions: 4, LeaseTTL: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l.Stop(sctx)
	})
	return l
}

// jsonWorker runs a worker on namespace ns of url whose handler answers
// {"key": <job key>, "got": <the JSON payload>}, for the JSON helpers.
func jsonWorker(t *testing.T, url, ns string) {
	t.Helper()
	jsonWorkerOf(t, url, keylane.TopologyConfig{Namespace: ns, Partitions: 2, LeaseTTL: 2 * time.Second})
}

// delayWorker runs a worker on namespace ns of url, made with delayed
// jobs, whose handler answers {"key": <job key>, "got": <the JSON
// payload>, "at": <when it ran, Unix ms>}: a delayed job's outcome says
// when it ran.
func delayWorker(t *testing.T, url, ns string) {
	t.Helper()
	jsonWorkerOf(t, url, keylane.TopologyConfig{Namespace: ns, Partitions: 2, LeaseTTL: 2 * time.Second, Delays: true})
}

func jsonWorkerOf(t *testing.T, url string, tc keylane.TopologyConfig) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	h := keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
		var got any
		if err := json.Unmarshal(job.Payload, &got); err != nil {
			return nil, keylane.Permanent(err)
		}
		return json.Marshal(map[string]any{"key": job.Key, "got": got, "at": time.Now().UnixMilli()})
	})
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: tc,
		Handler:  h,
		ID:       tc.Namespace + "-worker",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
}

// bigServer runs a second server whose max_payload (12 MiB) is above the
// wire's limit on a batch of several jobs (wire.MaxBatchBytes, 8 MiB),
// with a worker on namespace ns whose handler answers the payload's
// length in bytes: a job too large for a batch of several travels as a
// batch of one, which a worker runs. It returns the server's URL.
func bigServer(t *testing.T, ns string) string {
	t.Helper()
	s := natstest.StartConfig(t, "max_payload: 12582912\n")
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: ns, Partitions: 2, LeaseTTL: 5 * time.Second},
		Handler: keylane.HandlerFunc(func(ctx context.Context, job keylane.Job) ([]byte, error) {
			return []byte(strconv.Itoa(len(job.Payload))), nil
		}),
		ID:      ns + "-worker",
		AckWait: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(sctx)
	})
	return s.ClientURL()
}

// capNamespace sets up namespace ns of url with a per-key backlog cap of
// 2, a duplicate window shortened to 100ms and no worker, so a key's
// third queued job is refused. It fills key "queued:1" with two jobs, the
// first with ID "order-q", and waits until the server forgot that ID: a
// retry of it is then refused over the cap, not as a duplicate, though
// the job is stored (the Node client must read the key's queue to tell).
func capNamespace(t *testing.T, url, ns string) {
	t.Helper()
	js := jetStreamAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: ns, Partitions: 2, MaxKeyBacklog: 2})
	if err != nil {
		t.Fatal(err)
	}
	info, err := topo.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sc := info.Config
	sc.Duplicates = 100 * time.Millisecond
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	c, err := keylane.NewClient(ctx, js.Conn(), keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Submit(ctx, "queued:1", []byte("buy 1"), keylane.WithID("order-q")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "queued:1", []byte("buy 1")); err != nil {
		t.Fatal(err)
	}
	subject := partition.Subject(ns, partition.Of("queued:1", topo.Partitions), "queued:1")
	testwait.Eventually(t, 10*time.Second, "the server forgot order-q (a copy is refused over the cap)", func() bool {
		m := nats.NewMsg(subject)
		m.Header.Set(nats.MsgIdHdr, "order-q")
		_, err := js.PublishMsg(ctx, m)
		var apiErr *jetstream.APIError
		return errors.As(err, &apiErr) && apiErr.ErrorCode == 10077 // over the subject's cap
	})
}

// permServer runs a second server whose user "limited" may do anything
// but publish jobs of namespace "perm" (set up there by "admin"), and
// returns its URL: the server refuses such a publish with a permissions
// violation, which the Node client must report rather than wait out.
func permServer(t *testing.T) string {
	t.Helper()
	s := natstest.StartConfig(t, `authorization {
  users: [
    { user: admin, password: admin-secret }
    { user: limited, password: limited-secret, permissions: { publish: { deny: ["perm.jobs.>"] } } }
  ]
}
`)
	js := jetStreamAt(t, s.ClientURL(), nats.UserInfo("admin", "admin-secret"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "perm", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	return s.ClientURL()
}

// heldNamespace sets up namespace ns of url with one partition, writes
// key "k"'s state with a first worker, then deletes the jobs stream and
// creates it again under a second worker: that worker holds every new
// job of "k" (its state carries the old stream's epoch, ErrEpoch) and
// tells the job's call so.
func heldNamespace(t *testing.T, url, ns string) {
	t.Helper()
	js := jetStreamAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc := keylane.TopologyConfig{Namespace: ns, Partitions: 1, LeaseTTL: 2 * time.Second}
	topo, err := keylane.Setup(ctx, js, tc)
	if err != nil {
		t.Fatal(err)
	}
	count := keylane.ReducerFunc(func(_ context.Context, _ keylane.Job, cur []byte) ([]byte, []byte, error) {
		n, _ := strconv.Atoi(string(cur))
		next := []byte(strconv.Itoa(n + 1))
		return next, next, nil
	})
	start := func(id string) *keylane.Worker {
		wnc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wnc.Close)
		w, err := keylane.NewWorker(wnc, keylane.WorkerConfig{Topology: tc, Reducer: count, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, 20*time.Second, id+" owns the partition", func() bool { return len(w.Owned()) == 1 })
		return w
	}
	w1 := start("held-1")
	c, err := keylane.NewClient(ctx, js.Conn(), keylane.ClientConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, "k", nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := w1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, keylane.Names{Namespace: ns}.Jobs()); err != nil {
		t.Fatal(err)
	}
	if _, err := keylane.Setup(ctx, js, tc); err != nil {
		t.Fatal(err)
	}
	w2 := start("held-2")
	t.Cleanup(func() {
		// Adopting the old epoch releases the held jobs, so the worker
		// stops without waiting on them.
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := keylane.AdoptEpoch(sctx, js, ns, topo.Meta.Epoch); err != nil {
			t.Error(err)
		}
		_ = w2.Stop(sctx)
	})
}

// TestNodeClient runs the Node client's own tests (node --test) against a
// real server and real Go workers: submit, call, JSON helpers, retries by
// ID, refusals and bounded timeouts, result(id) of a Go client's batched
// Call (batchedCall), and the conformance vectors.
func TestNodeClient(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm)
	l := startSale(t, "nodetest")
	jsonWorker(t, l.URL, "nodejson")
	delayWorker(t, l.URL, "nodedelay")
	capNamespace(t, l.URL, "nodecap")
	perm := permServer(t)
	heldNamespace(t, l.URL, "nodeheld")
	big := bigServer(t, "nodebig")
	batchedID, batchedResult, garbledID := batchedCall(t, l, "nodetest")
	env := []string{"KEYLANE_NATS_URL=" + l.URL, "KEYLANE_NAMESPACE=nodetest", "KEYLANE_JSON_NAMESPACE=nodejson", "KEYLANE_DELAY_NAMESPACE=nodedelay", "KEYLANE_CAP_NAMESPACE=nodecap",
		"KEYLANE_HELD_NAMESPACE=nodeheld", "KEYLANE_PERM_URL=" + perm, "KEYLANE_PERM_USER=limited", "KEYLANE_PERM_PASS=limited-secret",
		"KEYLANE_BATCHED_ID=" + batchedID, "KEYLANE_BATCHED_RESULT=" + batchedResult, "KEYLANE_GARBLED_BATCHED_ID=" + garbledID,
		"KEYLANE_BIG_URL=" + big, "KEYLANE_BIG_NAMESPACE=nodebig"}
	if err := run(t, env, node, "--test", "dist/test/client.test.js", "dist/test/conformance.test.js"); err != nil {
		t.Fatal(err)
	}
}

// buyerAnswer is one purchase's answer: the result ("sold N" or
// "soldout N"), or the error that ended it.
type buyerAnswer struct{ id, sku, result, err string }

// nodeBuyers is a running scripts/buyers.js.
type nodeBuyers struct {
	answers chan buyerAnswer // closed when the process's output ends
	stdin   io.WriteCloser
	done    chan struct{} // closed when the process has exited
	err     error         // its exit, once done
}

// startNodeBuyers starts scripts/buyers.js with env added and waits until
// it is connected and ready to buy (it buys once go is called).
func startNodeBuyers(t *testing.T, ctx context.Context, node string, env ...string) *nodeBuyers {
	t.Helper()
	cmd := exec.CommandContext(ctx, node, "dist/scripts/buyers.js")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = &logWriter{t: t, who: "buyers.js stderr"}
	stdin, err := cmd.StdinPipe()
	var out io.ReadCloser
	if err == nil {
		out, err = cmd.StdoutPipe()
	}
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	b := &nodeBuyers{answers: make(chan buyerAnswer, 4096), stdin: stdin, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(b.done)
		s := bufio.NewScanner(out)
		announced := false
		for s.Scan() {
			var a struct {
				ID, SKU, Result, Error string
				Ready                  bool
			}
			switch err := json.Unmarshal(s.Bytes(), &a); {
			case err != nil:
				b.answers <- buyerAnswer{err: fmt.Sprintf("buyers.js printed %q: %v", s.Text(), err)}
			case a.Ready && !announced:
				announced = true
				close(ready)
			default:
				b.answers <- buyerAnswer{a.ID, a.SKU, a.Result, a.Error}
			}
		}
		close(b.answers)
		b.err = cmd.Wait()
		if !announced {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("node buyers not ready in time")
	}
	select {
	case <-b.done:
		t.Fatalf("node buyers ended before they were ready: %v", b.err)
	default:
	}
	return b
}

// goAhead starts the buying.
func (b *nodeBuyers) goAhead(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(b.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its answers.
func (b *nodeBuyers) wait(t *testing.T) []buyerAnswer {
	t.Helper()
	var all []buyerAnswer
	for a := range b.answers {
		all = append(all, a)
	}
	<-b.done
	if b.err != nil {
		t.Fatalf("node buyers: %v", b.err)
	}
	return all
}

// stockSKUs sets every SKU's stock to start.
func stockSKUs(t *testing.T, ctx context.Context, c *keylane.Client, skus []string, start int) {
	t.Helper()
	for _, sku := range skus {
		if _, err := c.Call(ctx, sku, []byte("set "+strconv.Itoa(start))); err != nil {
			t.Fatal(err)
		}
	}
}

// verdict checks a sale's answers against the SKUs' stock: every purchase
// answered, none oversold, each SKU's stock its start less the purchases
// answered "sold", and each "sold" answer of a SKU naming a distinct
// stock left (with the final stock, no room for a purchase applied
// twice). It returns how many were sold, by ID prefix ("node", "go").
func verdict(t *testing.T, ctx context.Context, c *keylane.Client, skus []string, start int, answers []buyerAnswer) map[string]int {
	t.Helper()
	sold := map[string]int{}
	by := map[string]int{}
	left := map[string]map[int]string{}
	for _, a := range answers {
		if a.err != "" {
			t.Errorf("purchase %s of %s: %s", a.id, a.sku, a.err)
			continue
		}
		op, n, ok := strings.Cut(a.result, " ")
		k, err := strconv.Atoi(n)
		if !ok || err != nil || (op != "sold" && op != "soldout") {
			t.Errorf("purchase %s of %s answered %q", a.id, a.sku, a.result)
			continue
		}
		if op == "soldout" {
			continue
		}
		sold[a.sku]++
		prefix, _, _ := strings.Cut(a.id, "-")
		by[prefix]++
		if left[a.sku] == nil {
			left[a.sku] = map[int]string{}
		}
		if other, dup := left[a.sku][k]; dup {
			t.Errorf("%s: purchases %s and %s both left %d: one sale counted twice", a.sku, other, a.id, k)
		}
		left[a.sku][k] = a.id
	}
	for _, sku := range skus {
		res, err := c.Call(ctx, sku, []byte("get"))
		if err != nil {
			t.Fatal(err)
		}
		stock, err := strconv.Atoi(strings.TrimPrefix(string(res), "stock "))
		if err != nil {
			t.Fatalf("get %s = %q", sku, res)
		}
		if sold[sku] > start || stock < 0 {
			t.Errorf("%s oversold: %d sold of %d, stock %d", sku, sold[sku], start, stock)
		}
		if stock != start-sold[sku] {
			t.Errorf("%s: stock %d, want start %d - sold %d = %d", sku, stock, start, sold[sku], start-sold[sku])
		}
	}
	t.Logf("sold %v: by buyer %v", sold, by)
	return by
}

// TestNodeAndGoBuyers is the mixed run: Node buyers (scripts/buyers.ts, a
// node process) and Go buyers (keylane.Client Calls) buy the same SKUs at
// once, every purchase with its own job ID. One verdict over both: no
// SKU oversold, each SKU's stock is its start less the purchases
// answered "sold", and every answered purchase was applied exactly once
// (each "sold" answer of a SKU names a distinct stock left, and the
// final stock leaves no room for a purchase applied twice).
func TestNodeAndGoBuyers(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm)
	l := startSale(t, "mixed")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := l.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	skus := []string{"sku:mixed-1", "sku:mixed-2", "sku:mixed-3"}
	const start = 40
	stockSKUs(t, ctx, c, skus, start)
	// Demand (8 × 20 from Node, 4 × 20 from Go: 240) is twice the stock
	// (120): every SKU sells out, and some buyers are told so. Go alone
	// cannot buy it all.
	const nodeBuyers, goBuyers, purchases = 8, 4, 20
	nb := startNodeBuyers(t, ctx, node, "KEYLANE_NATS_URL="+l.URL, "KEYLANE_NAMESPACE=mixed",
		"SKUS="+strings.Join(skus, ","), "BUYERS="+strconv.Itoa(nodeBuyers),
		"PURCHASES="+strconv.Itoa(purchases), "PREFIX=node")
	// Both sides start together.
	nb.goAhead(t)
	var mu sync.Mutex
	var answers []buyerAnswer
	var wg sync.WaitGroup
	for b := range goBuyers {
		wg.Go(func() {
			for n := range purchases {
				sku := skus[(b+n)%len(skus)]
				id := fmt.Sprintf("go-%d-%d", b, n)
				a := buyerAnswer{id: id, sku: sku}
				for range 5 { // again with the same ID after no reply
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					res, err := c.Call(cctx, sku, []byte("buy 1"), keylane.WithID(id))
					cancel()
					a.result, a.err = string(res), ""
					if err != nil {
						a.err = err.Error()
					}
					if !errors.Is(err, keylane.ErrNoReply) {
						break
					}
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		})
	}
	fromNode := nb.wait(t)
	wg.Wait()
	answers = append(answers, fromNode...)
	if want := (nodeBuyers + goBuyers) * purchases; len(answers) != want {
		t.Fatalf("%d purchases answered, want %d", len(answers), want)
	}
	by := verdict(t, ctx, c, skus, start, answers)
	if by["node"]+by["go"] != start*len(skus) {
		t.Errorf("%d sold, want all %d (demand was twice the stock)", by["node"]+by["go"], start*len(skus))
	}
	if by["node"] == 0 || by["go"] == 0 {
		t.Errorf("not a mixed run: %d sold to Node buyers, %d to Go buyers", by["node"], by["go"])
	}
}

// TestNodeBuyersThroughCuts: Node buyers whose connection runs through a
// fault proxy that cuts it (every connection closed, none accepted for a
// moment) three times while they buy. Publishes, acks and replies are lost
// with the connection; the client publishes again with the job's ID and
// reads kept outcomes, and a buyer calls again with the same ID after
// no_reply. The verdict: every purchase answered, no oversell, stock =
// start - sold, each sale applied once.
func TestNodeBuyersThroughCuts(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm)
	l := startSale(t, "nodecut")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := l.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := faultproxy.New(l.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	skus := []string{"sku:cut-1", "sku:cut-2"}
	const start = 50
	stockSKUs(t, ctx, c, skus, start)
	const buyers, purchases = 4, 20 // demand 80 of a stock of 100
	nb := startNodeBuyers(t, ctx, node, "KEYLANE_NATS_URL="+p.URL(), "KEYLANE_NAMESPACE=nodecut",
		"SKUS="+strings.Join(skus, ","), "BUYERS="+strconv.Itoa(buyers),
		"PURCHASES="+strconv.Itoa(purchases), "PREFIX=node", "RECONNECT_WAIT=50")
	nb.goAhead(t)
	var answers []buyerAnswer
	cuts := 0
	for a := range nb.answers {
		answers = append(answers, a)
		// A cut after every 15 answers, three in all: calls are in flight
		// each time (the buyers run concurrently).
		if len(answers)%15 == 0 && cuts < 3 {
			cuts++
			p.Cut()
			time.Sleep(200 * time.Millisecond) // the outage
			if err := p.Restore(); err != nil {
				t.Fatal(err)
			}
		}
	}
	answers = append(answers, nb.wait(t)...)
	if cuts != 3 {
		t.Fatalf("%d cuts, want 3", cuts)
	}
	if want := buyers * purchases; len(answers) != want {
		t.Fatalf("%d purchases answered, want %d", len(answers), want)
	}
	by := verdict(t, ctx, c, skus, start, answers)
	if by["node"] != buyers*purchases {
		t.Errorf("%d sold, want all %d purchases (stock was enough)", by["node"], buyers*purchases)
	}
}

// batchedCall makes Calls from a Go client (batches on) on one SKU of
// namespace ns at once, so that they go in batch messages whose outcomes
// the workers keep per batch (wire.BatchOutcomesKey), and returns the job
// ID of one (wire.BatchedJobID: the ID a Go NoReplyError names) with its
// result as the Go side reads it (keylane.InspectJob): what the Node
// client's result(id) must answer. garbledID names a batch whose entry
// this puts garbled: result(garbledID) must refuse it, not answer.
func batchedCall(t *testing.T, l *sale.Local, ns string) (id, result, garbledID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := l.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Call(ctx, "batched", []byte("set 100")); err != nil {
		t.Fatal(err)
	}
	js := jetStreamAt(t, l.URL)
	kv, err := js.KeyValue(ctx, keylane.Names{Namespace: ns}.Results())
	if err != nil {
		t.Fatal(err)
	}
	// A lone Call goes alone (a one-job message): buy in rounds of 16 at
	// once until an entry holds a batch's outcomes.
	entry := testwait.Until(t, time.Minute, "a batch entry in the results bucket", func() (string, bool) {
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() { _, _ = cl.Call(ctx, "batched", []byte("buy 1")) })
		}
		wg.Wait()
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return err.Error(), false
		}
		for k := range keys.Keys() {
			if strings.HasPrefix(k, wire.BatchOutcomesPrefix) {
				_ = keys.Stop()
				return k, true
			}
		}
		return "none yet", false
	})
	e, err := kv.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	batchID, outs, err := wire.DecodeBatchOutcomes(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	id = outs[len(outs)-1].ID
	f, err := keylane.InspectJob(ctx, js, ns, id, "")
	if err != nil || f.Where != keylane.FoundBatch || f.Err != nil {
		t.Fatalf("InspectJob(%s) = %+v, %v; want its result from the batch entry", id, f, err)
	}
	// Another batch's entry, garbled: the job IDs it names point here.
	garbled := "Zz9Zz9Zz9Zz9Zz9Zz9Zz9Z"
	if batchID == garbled {
		t.Fatal("the test's garbled batch ID is the real one's")
	}
	if _, err := kv.Put(ctx, wire.BatchOutcomesKey(garbled), []byte("KLO\x01garbage")); err != nil {
		t.Fatal(err)
	}
	return id, string(f.Result), wire.BatchedJobID(garbled, 0)
}

// jetStreamAt connects to url (with opts) for the test's own requests; the
// connection is closed when the test ends.
func jetStreamAt(t *testing.T, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
