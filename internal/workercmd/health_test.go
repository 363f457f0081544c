package workercmd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
)

// get fetches path from the worker's metrics address: status and body,
// or 0 and the error.
func get(addr, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /readyz follows the worker: 200 once started, 503 naming NATS while
// the server is away, 200 again once it is back, 503 "draining" while a
// stop waits for a running job; /healthz stays 200 throughout.
func TestRunHealthAndReadiness(t *testing.T) {
	dir, port := t.TempDir(), testwait.FreePort(t)
	srv := natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	var logs logBuffer
	c := config(t, t.TempDir(), logs.logger())
	c.URL = srv.ClientURL()
	c.Drain = 30 * time.Second
	c.Worker.Topology.Partitions = 1
	c.Metrics = fmt.Sprintf("127.0.0.1:%d", testwait.FreePort(t))
	running, release := make(chan struct{}, 1), make(chan struct{})
	c.Worker.Handler = keylane.HandlerFunc(func(ctx context.Context, j keylane.Job) ([]byte, error) {
		if string(j.Payload) == "block" {
			running <- struct{}{}
			<-release
		}
		return nil, nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c, nil) }()
	defer func() {
		cancel()
		select {
		case <-release:
		default:
			close(release)
		}
		<-done
	}()
	status := func(path string, code int, says string) func() (string, bool) {
		return func() (string, bool) {
			got, body := get(c.Metrics, path)
			return fmt.Sprintf("%s: %d %q", path, got, body), got == code && strings.Contains(body, says)
		}
	}
	testwait.Until(t, 20*time.Second, "ready once started", status("/readyz", http.StatusOK, "ready"))
	testwait.Until(t, 5*time.Second, "healthy", status("/healthz", http.StatusOK, "ok"))

	srv.Shutdown()
	srv.WaitForShutdown()
	testwait.Until(t, 20*time.Second, "not ready with NATS away", status("/readyz", http.StatusServiceUnavailable, "NATS"))
	testwait.Until(t, 5*time.Second, "still healthy with NATS away", status("/healthz", http.StatusOK, "ok"))
	srv = natstest.Start(t, natstest.WithStoreDir(dir), natstest.WithPort(port))
	testwait.Until(t, 30*time.Second, "ready again once NATS is back", status("/readyz", http.StatusOK, "ready"))

	nc := natstest.Connect(t, srv)
	cl, err := keylane.NewClient(t.Context(), nc, keylane.ClientConfig{Namespace: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testwait.NoError(t, 30*time.Second, "submit a job that blocks", func() error {
		_, err := cl.Submit(t.Context(), "k", []byte("block"))
		return err
	})
	select {
	case <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the blocking job never ran")
	}
	cancel() // the signal: Run drains, waiting for the job
	testwait.Until(t, 10*time.Second, "not ready while draining", status("/readyz", http.StatusServiceUnavailable, "draining"))
	close(release)
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the job finished")
	}
}
