package workercmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/proctest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/lease"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// logBuffer is a log sink written by other goroutines while the test reads.
type logBuffer struct{ proctest.Buffer }

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&b.Buffer, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// config is the worker command's Config for an embedded server with its
// store in dir, as Parse makes it from the defaults.
func config(t *testing.T, dir string, log *slog.Logger) Config {
	t.Helper()
	c := Config{
		Listen: fmt.Sprintf("127.0.0.1:%d", testwait.FreePort(t)),
		Data:   dir,
		Ping:   2 * time.Second,
		Drain:  5 * time.Second,
	}
	c.Worker.ID = "w1"
	c.Worker.Logger = log
	c.Worker.Topology = keylane.TopologyConfig{Namespace: "ops", LeaseTTL: 10 * time.Second}
	return c
}

// setupIn makes the namespace "ops" in the store in dir, with an embedded
// server that is shut down again, as an earlier worker run would have.
func setupIn(t *testing.T, dir string, tc keylane.TopologyConfig, then ...func(jetstream.JetStream)) {
	t.Helper()
	s := natstest.Start(t, natstest.WithStoreDir(dir))
	nc := natstest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	tc.Namespace = "ops"
	if _, err := keylane.Setup(t.Context(), js, tc); err != nil {
		t.Fatal(err)
	}
	for _, f := range then {
		f(js)
	}
	nc.Close()
	s.Shutdown()
	s.WaitForShutdown()
}

func TestRunRefusalNamesTheFlag(t *testing.T) {
	t.Run("taken --listen", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c := config(t, t.TempDir(), nil)
		c.Listen = ln.Addr().String()
		err = Run(t.Context(), c, nil)
		if !errors.Is(err, embedded.ErrAddrInUse) || !strings.Contains(err.Error(), "--listen") || !strings.Contains(err.Error(), c.Listen) {
			t.Fatalf("Run on a taken %s: %v; want ErrAddrInUse naming --listen and the address", c.Listen, err)
		}
	})
	t.Run("stale --data", func(t *testing.T) {
		dir := t.TempDir()
		setupIn(t, dir, keylane.TopologyConfig{Partitions: 4, LeaseTTL: 10 * time.Second})
		c := config(t, dir, nil)
		c.Worker.Topology.Partitions = 8
		err := Run(t.Context(), c, nil)
		if !errors.Is(err, keylane.ErrPartitionMismatch) || !strings.Contains(err.Error(), "--data "+dir) {
			t.Fatalf("Run on a store made with 4 partitions, asking 8: %v; want ErrPartitionMismatch naming --data %s", err, dir)
		}
	})
	t.Run("other --lease-ttl", func(t *testing.T) {
		dir := t.TempDir()
		setupIn(t, dir, keylane.TopologyConfig{Partitions: 4, LeaseTTL: 10 * time.Second})
		c := config(t, dir, nil)
		c.Worker.Topology.LeaseTTL = 5 * time.Second
		err := Run(t.Context(), c, nil)
		if !errors.Is(err, lease.ErrBucketMismatch) || !strings.Contains(err.Error(), "--lease-ttl 5s") {
			t.Fatalf("Run with --lease-ttl 5s on a namespace made with 10s: %v; want lease.ErrBucketMismatch naming --lease-ttl 5s", err)
		}
	})
	t.Run("other --reply-prefix", func(t *testing.T) {
		dir := t.TempDir()
		setupIn(t, dir, keylane.TopologyConfig{Partitions: 4, LeaseTTL: 10 * time.Second, ReplyPrefix: "_INBOX.ops."})
		c := config(t, dir, nil)
		c.Worker.Topology.ReplyPrefix = "_INBOX.x."
		err := Run(t.Context(), c, nil)
		if !errors.Is(err, keylane.ErrReplyPrefixMismatch) || !strings.Contains(err.Error(), `--reply-prefix "_INBOX.x."`) || !strings.Contains(err.Error(), `"_INBOX.ops."`) {
			t.Fatalf("Run with --reply-prefix _INBOX.x. on a namespace made with _INBOX.ops.: %v; want ErrReplyPrefixMismatch naming both", err)
		}
	})
	t.Run("other --max-deliver", func(t *testing.T) {
		dir := t.TempDir()
		setupIn(t, dir, keylane.TopologyConfig{Partitions: 4, LeaseTTL: 10 * time.Second}, func(js jetstream.JetStream) {
			// What the namespace's first worker, run with --max-deliver 3, wrote.
			s, err := js.Stream(t.Context(), "OPS_JOBS")
			if err != nil {
				t.Fatal(err)
			}
			sc := s.CachedInfo().Config
			sc.Metadata[keylane.MetaMaxDeliver] = "3"
			if _, err := js.UpdateStream(t.Context(), sc); err != nil {
				t.Fatal(err)
			}
		})
		c := config(t, dir, nil)
		c.Worker.MaxDeliver = 7
		err := Run(t.Context(), c, nil)
		if !errors.Is(err, keylane.ErrMaxDeliverMismatch) || !strings.Contains(err.Error(), "--max-deliver 7") || !strings.Contains(err.Error(), "after 3 attempts") {
			t.Fatalf("Run with --max-deliver 7 on a namespace whose workers use 3: %v; want ErrMaxDeliverMismatch naming both", err)
		}
	})
}

// A stop says so, with its drain bound as a duration.
func TestRunLogsStop(t *testing.T) {
	var logs logBuffer
	c := config(t, t.TempDir(), logs.logger())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, nil) }()
	testwait.Eventually(t, 20*time.Second, "the worker starts", func() bool { return strings.Contains(logs.String(), "worker started") })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * c.Drain):
		t.Fatal("Run did not return after its context ended")
	}
	out := logs.String()
	if !strings.Contains(out, `msg="stopping: signal received, draining" within=5s`) {
		t.Fatalf("no stop line with the drain bound in:\n%s", out)
	}
	// A clean stop closes the connection on purpose: no WARN says it
	// was lost and is being reconnected.
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "reconnecting") {
			t.Errorf("a clean stop logged: %s", l)
		}
	}
}

// The connection's disconnect, reconnect and close are logged.
func TestConnHandlersLog(t *testing.T) {
	var logs logBuffer
	dir := t.TempDir()
	port := testwait.FreePort(t)
	s := natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	opts := append(connHandlers(logs.logger()), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	testwait.Eventually(t, 5*time.Second, "the disconnect is logged", func() bool { return strings.Contains(logs.String(), "NATS disconnected") })
	natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	testwait.Eventually(t, 10*time.Second, "the reconnect is logged", func() bool { return strings.Contains(logs.String(), "NATS reconnected") })
	nc.Close()
	testwait.Eventually(t, 5*time.Second, "the close is logged", func() bool { return strings.Contains(logs.String(), "NATS connection closed") })
}

// --metrics serves the worker's counters, per-partition gauges and job
// histograms, the histograms fed by the jobs the worker ran.
func TestRunServesMetrics(t *testing.T) {
	var logs logBuffer
	c := config(t, t.TempDir(), logs.logger())
	c.Worker.Topology.Partitions = 2
	c.Metrics = fmt.Sprintf("127.0.0.1:%d", testwait.FreePort(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, nil) }()
	defer func() { cancel(); <-done }()
	testwait.Eventually(t, 20*time.Second, "the worker starts", func() bool { return strings.Contains(logs.String(), "worker started") })
	nc, err := nats.Connect("nats://" + c.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, p := range []string{"set 10", "buy 1", "get"} {
		if _, err := cl.Call(ctx, "sku:1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	scrape := func() string {
		resp, err := http.Get("http://" + c.Metrics + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The worker's own series carry its namespace, so that a dashboard
	// scraping the workers of several namespaces can tell them apart.
	want := []string{
		`keylane_job_end_to_end_seconds_count{namespace="ops"} 3`,
		`keylane_job_queue_wait_seconds_count{namespace="ops"} 3`,
		`keylane_group_jobs_sum{namespace="ops"} 3`,
		`keylane_partition_backlog{namespace="ops",partition="0",worker="w1"} 0`,
		`keylane_partition_in_flight{namespace="ops",partition="1",worker="w1"} 0`,
		`keylane_lease_trusted_for_seconds{namespace="ops",partition="1",worker="w1"}`,
		`keylane_jobs_succeeded_total{namespace="ops",worker="w1"} 3`,
		`keylane_nats_connected{namespace="ops",worker="w1"} 1`,
		`keylane_lease_renew_seconds_bucket{namespace="ops",`,
		`keylane_dead_letters{namespace="ops"} 0`,
	}
	testwait.Until(t, 10*time.Second, "the metrics show the 3 jobs", func() (string, bool) {
		body := scrape()
		for _, w := range want {
			if !strings.Contains(body, w) {
				return "missing " + w + " in:\n" + body, false
			}
		}
		return body, true
	})
}

// --metrics serves the status page beside the metrics: the page shows this
// worker owning the namespace's partitions.
func TestRunServesTheStatusPage(t *testing.T) {
	c := config(t, t.TempDir(), nil)
	c.Worker.Topology.Partitions = 2
	c.Metrics = fmt.Sprintf("127.0.0.1:%d", testwait.FreePort(t))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	get := func(path string) (int, string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+c.Metrics+path, nil)
		if err != nil {
			return 0, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	testwait.Eventually(t, 20*time.Second, "status.json shows w1 owning both partitions", func() bool {
		code, body, err := get("/status.json")
		if err != nil || code != http.StatusOK {
			return false
		}
		var p statuspage.Page
		if json.Unmarshal([]byte(body), &p) != nil || p.Status == nil || p.Worker != "w1" || p.Status.Namespace != "ops" || len(p.Status.Partition) != 2 {
			return false
		}
		for _, ps := range p.Status.Partition {
			if ps.Owner != "w1" {
				return false
			}
		}
		return true
	})
	if code, body, err := get("/"); err != nil || code != http.StatusOK || !strings.Contains(body, `<td class="owner" data-label="owner">w1</td>`) {
		t.Fatalf("GET /: %d %v\n%s", code, err, body)
	}
	if code, body, err := get("/metrics"); err != nil || code != http.StatusOK || !strings.Contains(body, `keylane_partitions_owned{namespace="ops",worker="w1"} 2`) {
		t.Fatalf("GET /metrics: %d %v\n%s", code, err, body)
	}
}

// TestRunRefusesReplicasOnOneServer: `worker --replicas 3` against a
// single server that is not clustered is refused by the server with error
// 10074, which no retry cures. Run ends at once with an error naming
// --replicas and the refusal, and logs it at ERROR (on main Setup retried
// the refusal silently until its context ended).
func TestRunRefusesReplicasOnOneServer(t *testing.T) {
	srv := natstest.Start(t)
	var logs logBuffer
	c := config(t, t.TempDir(), logs.logger())
	c.URL = srv.ClientURL()
	c.Worker.Topology.Replicas = 3
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := Run(ctx, c, nil)
	var apiErr *jetstream.APIError
	if ctx.Err() != nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10074 || !strings.Contains(err.Error(), "--replicas 3") {
		t.Fatalf("Run with --replicas 3 on one server: %v; want the server's refusal 10074 naming --replicas 3, before the context ended", err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "10074") {
		t.Fatalf("no ERROR line with the refusal in the log:\n%s", logs.String())
	}
}
