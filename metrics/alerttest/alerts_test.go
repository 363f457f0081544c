package alerttest

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/util/teststorage"
)

// rulesFile is the rule file keylane ships.
const rulesFile = "../../docs/alerts.yml"

// step is the synthetic scrape and evaluation interval.
const step = 15 * time.Second

// buildWorker builds the worker command from the repository, once per
// test binary.
func buildWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "worker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/worker")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/worker: %v\n%s", err, out)
	}
	return bin
}

// worker is a worker command process serving its /metrics.
type worker struct {
	id, namespace, addr string
	cmd                 *exec.Cmd
	killed              bool
}

func startWorker(t *testing.T, bin, natsURL, namespace, id string) *worker {
	t.Helper()
	w := &worker{id: id, namespace: namespace, addr: "127.0.0.1:" + strconv.Itoa(testwait.FreePort(t))}
	w.cmd = exec.Command(bin, "--nats", natsURL, "--namespace", namespace, "--partitions", "4",
		"--lease-ttl", "3s", "--id", id, "--metrics", w.addr, "--log-level", "warn")
	w.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")} // no KEYLANE_* of the caller's
	logf, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !w.killed {
			_ = w.cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = w.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = w.cmd.Process.Kill()
				<-done
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("log of %s:\n%s", id, b)
		}
	})
	testwait.Eventually(t, 60*time.Second, id+" ready", func() bool {
		resp, err := http.Get("http://" + w.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return w
}

// kill ends the worker with SIGKILL: it releases nothing.
func (w *worker) kill(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	w.killed = true
}

// sample is one series of a scrape.
type sample struct {
	lbls labels.Labels
	v    float64
}

// scrape reads a worker's /metrics as Prometheus would, with the target's
// job and instance labels; histograms and summaries are left out (no rule
// reads them). ok is false if the target does not answer.
func scrape(t *testing.T, w *worker) ([]sample, bool) {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + w.addr + "/metrics")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", w.id, err)
	}
	var out []sample
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var v float64
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_UNTYPED:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			b := labels.NewBuilder(labels.EmptyLabels())
			b.Set(labels.MetricName, name)
			b.Set("job", "keylane")
			b.Set("instance", w.addr)
			for _, lp := range m.GetLabel() {
				b.Set(lp.GetName(), lp.GetValue())
			}
			out = append(out, sample{b.Labels(), v})
		}
	}
	return out, true
}

// prom is Prometheus's storage and rule engine with keylane's rule file
// loaded, scraping the workers and evaluating the rules at synthetic
// times step apart (promtool test rules does the same): the values are
// the workers' real ones, the clock between scrapes is compressed so
// that the rules' for: durations pass.
type prom struct {
	t      *testing.T
	store  *teststorage.TestStorage
	groups map[string]*rules.Group
	now    time.Time
	last   map[string][]sample // by instance: the series of its last scrape
	// fired holds, by alert name, the sorted namespaces (or "" for none)
	// it fired for, and firedAt when it first fired for each.
	fired map[string]map[string]time.Time
}

func newProm(t *testing.T, start time.Time) *prom {
	t.Helper()
	store := teststorage.New(t)
	engine := promql.NewEngine(promql.EngineOpts{
		Logger: promslog.NewNopLogger(), MaxSamples: 1e6, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute,
	})
	t.Cleanup(func() { _ = engine.Close() })
	p := parser.NewParser(parser.Options{})
	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(engine, store),
		AppendableV2: store,
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
		Parser:       p,
	})
	groups, errs := m.LoadGroups(step, labels.EmptyLabels(), "", nil, false, rulesFile)
	if len(errs) > 0 {
		t.Fatalf("Prometheus refuses %s: %v", rulesFile, errs)
	}
	for _, g := range groups {
		for _, r := range g.Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true) // as promtool: the for: state starts now
			}
		}
	}
	return &prom{t: t, store: store, groups: groups, now: start.Truncate(time.Millisecond), last: map[string][]sample{}, fired: map[string]map[string]time.Time{}}
}

// tick scrapes every worker at the current synthetic time (a worker that
// does not answer has its series marked stale, as Prometheus does when a
// target goes away), evaluates the rules, records the firing alerts, and
// moves the clock on by one step. It returns the alerts firing now, as
// "Alert{namespace}".
func (p *prom) tick(ws ...*worker) []string {
	t := p.t
	t.Helper()
	ts := p.now.UnixMilli()
	app := p.store.Appender(context.Background())
	for _, w := range ws {
		up := 1.0
		got, ok := scrape(t, w)
		if !ok {
			up = 0
			for _, s := range p.last[w.addr] {
				if _, err := app.Append(0, s.lbls, ts, math.Float64frombits(value.StaleNaN)); err != nil {
					t.Fatal(err)
				}
			}
			got = nil
		}
		p.last[w.addr] = got
		got = append(got, sample{labels.FromStrings(labels.MetricName, "up", "job", "keylane", "instance", w.addr), up})
		for _, s := range got {
			if _, err := app.Append(0, s.lbls, ts, s.v); err != nil {
				t.Fatalf("append %s: %v", s.lbls, err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	var firing []string
	for _, g := range p.groups {
		g.Eval(context.Background(), p.now)
		for _, r := range g.Rules() {
			if err := r.LastError(); err != nil {
				t.Fatalf("rule %s at %s: %v", r.Name(), p.now, err)
			}
			ar, ok := r.(*rules.AlertingRule)
			if !ok {
				continue
			}
			for _, a := range ar.ActiveAlerts() {
				if a.State != rules.StateFiring {
					continue
				}
				ns := a.Labels.Get("namespace")
				firing = append(firing, ar.Name()+"{"+ns+"}")
				if p.fired[ar.Name()] == nil {
					p.fired[ar.Name()] = map[string]time.Time{}
				}
				if _, seen := p.fired[ar.Name()][ns]; !seen {
					p.fired[ar.Name()][ns] = p.now
				}
			}
		}
	}
	p.now = p.now.Add(step)
	slices.Sort(firing)
	return slices.Compact(firing)
}

// gauge returns the value of a scraped series of w, NaN if it has none.
func gauge(t *testing.T, w *worker, name string, lbls ...string) float64 {
	t.Helper()
	got, ok := scrape(t, w)
	if !ok {
		return math.NaN()
	}
	want := append([]string{labels.MetricName, name}, lbls...)
next:
	for _, s := range got {
		for i := 0; i+1 < len(want); i += 2 {
			if s.lbls.Get(want[i]) != want[i+1] {
				continue next
			}
		}
		return s.v
	}
	return math.NaN()
}

// Two namespaces, "shop" (two workers) and "ship" (one), each a worker
// command process with its real /metrics, on one in-process NATS server;
// Prometheus's own storage, PromQL engine and rule manager load
// docs/alerts.yml and evaluate it over their scrapes.
//
// Healthy (jobs run, none fails): no rule fires in 12 minutes.
//
// Faults: every worker of "ship" is killed (SIGKILL) with a job waiting
// in it, and jobs of "shop" fail for good. The live workers of "shop"
// alone then report that "ship" has no live worker
// (KeylaneNamespaceNoWorker) and unowned partitions
// (KeylaneUnownedPartitions), that its job has waited past 5 minutes
// (KeylaneOldestJobWaiting, not before), and that "shop"'s dead letters
// grow (KeylaneDeadLettersGrowing); none fires for the other namespace.
// Then "shop"'s workers die too: nothing is scraped, and KeylaneNoWorker
// fires.
func TestAlertRulesFireOnRealWorkers(t *testing.T) {
	bin := buildWorker(t)
	srv := natstest.Start(t)
	url := srv.ClientURL()
	shop1 := startWorker(t, bin, url, "shop", "shop-1")
	shop2 := startWorker(t, bin, url, "shop", "shop-2")
	ship1 := startWorker(t, bin, url, "ship", "ship-1")
	all := []*worker{shop1, shop2, ship1}

	nc := natstest.Connect(t, srv)
	ctx := t.Context()
	client := func(ns string) *keylane.Client {
		c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	shop, ship := client("shop"), client("ship")

	// Every worker reports both namespaces, each with its live workers
	// and every partition owned. Their namespace reads are 10 s apart.
	testwait.Eventually(t, 60*time.Second, "every worker reports both namespaces whole", func() bool {
		for _, w := range all {
			if gauge(t, w, "keylane_namespace_workers", "namespace", "shop") != 2 || gauge(t, w, "keylane_namespace_workers", "namespace", "ship") != 1 ||
				gauge(t, w, "keylane_unowned_partitions", "namespace", "shop") != 0 || gauge(t, w, "keylane_unowned_partitions", "namespace", "ship") != 0 {
				return false
			}
		}
		return true
	})

	p := newProm(t, time.Now())
	for i := range 48 { // 12 minutes, with jobs that run
		for _, c := range []*keylane.Client{shop, ship} {
			if _, err := c.Call(ctx, fmt.Sprintf("sku-%d", i%5), []byte("restock 1")); err != nil {
				t.Fatal(err)
			}
		}
		if firing := p.tick(all...); len(firing) > 0 {
			t.Fatalf("healthy, at %s: firing %v", p.now, firing)
		}
	}

	// The faults, on a clock of their own that reaches the present when
	// they begin: the waiting job's age (time() against its store time)
	// is then read as it would be, from 0.
	p = newProm(t, time.Now().Add(-4*step))
	for range 4 {
		p.tick(all...)
	}
	faultAt := p.now
	ship1.kill(t)
	if _, err := ship.Submit(ctx, "sku-waiting", []byte("buy 1")); err != nil {
		t.Fatal(err)
	}
	submitted := time.Now()
	for i := range 3 {
		if _, err := shop.Submit(ctx, fmt.Sprintf("bad-%d", i), []byte("no such command")); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Eventually(t, 60*time.Second, `"shop"'s workers report "ship" dead, its job waiting, and "shop"'s dead letters`, func() bool {
		for _, w := range []*worker{shop1, shop2} {
			if gauge(t, w, "keylane_namespace_workers", "namespace", "ship") != 0 || gauge(t, w, "keylane_unowned_partitions", "namespace", "ship") != 4 ||
				gauge(t, w, "keylane_dead_letters", "namespace", "shop") != 3 || gauge(t, w, "keylane_namespace_workers", "namespace", "shop") != 2 {
				return false
			}
		}
		return true
	})
	waitedSince := submitted // the job's store time, within the Submit
	for range 40 {           // 10 minutes
		p.tick(all...)
	}
	want := map[string]string{
		"KeylaneDeadLetters":        "shop",
		"KeylaneNamespaceNoWorker":  "ship",
		"KeylaneUnownedPartitions":  "ship",
		"KeylaneOldestJobWaiting":   "ship",
		"KeylaneDeadLettersGrowing": "shop",
	}
	for alert, ns := range want {
		at, ok := p.fired[alert][ns]
		if !ok {
			t.Errorf("%s did not fire for %q; fired: %v", alert, ns, p.fired)
			continue
		}
		t.Logf("%s{namespace=%q} fired %s after the faults", alert, ns, at.Sub(faultAt))
	}
	for alert, byNS := range p.fired {
		for ns := range byNS {
			if want[alert] != ns {
				t.Errorf("%s fired for %q in the fault scene, want only %v", alert, ns, want)
			}
		}
	}
	// The bound is 5 minutes of waiting, held for 1: not before.
	if at, ok := p.fired["KeylaneOldestJobWaiting"]["ship"]; ok && at.Sub(waitedSince) < 6*time.Minute-step {
		t.Errorf("KeylaneOldestJobWaiting fired %s after the job was stored, want at least 6 minutes (5 waiting, 1 held)", at.Sub(waitedSince))
	}

	// Nothing left to scrape: KeylaneNoWorker.
	shop1.kill(t)
	shop2.kill(t)
	for range 12 {
		p.tick(all...)
	}
	if _, ok := p.fired["KeylaneNoWorker"][""]; !ok {
		t.Errorf("KeylaneNoWorker did not fire with every worker dead; fired: %v", p.fired)
	}
}
