package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUIServesLoopbackAndRefusesOtherHosts: keylane ui serves the
// console where --listen says (a loopback address), answers a request
// for its address and refuses one naming another host (a page of another
// site whose name was pointed here), exports the namespace's gauges on
// /metrics with no worker running, and stops with its context. The
// browser tests are in statuspage/consoletest.
func TestUIServesLoopbackAndRefusesOtherHosts(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "ui", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	uctx, stop := context.WithCancel(ctx)
	var errOut lockedBuf
	done := make(chan error, 1)
	go func() {
		done <- run(uctx, []string{"ui", "--nats", srv.ClientURL(), "--namespace", "ui", "--listen", "127.0.0.1:0"}, io.Discard, &errOut)
	}()
	re := regexp.MustCompile(`serving namespace ui on (http://127\.0\.0\.1:[0-9]+/) with actions`)
	base := testwait.Until(t, 30*time.Second, "keylane ui says where it serves", func() (string, bool) {
		m := re.FindStringSubmatch(errOut.String())
		if m == nil {
			return errOut.String(), false
		}
		return m[1], true
	})
	get := func(host string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(""); code != http.StatusOK || !strings.Contains(body, "keylane namespace <code>ui</code>") {
		t.Fatalf("the console: %d\n%s", code, body)
	}
	if code, body := get("localhost:1234"); code != http.StatusOK {
		t.Fatalf("the console as localhost: %d\n%s", code, body)
	}
	if code, body := get("evil.example:80"); code != http.StatusMisdirectedRequest || !strings.Contains(body, "refused a request for host") {
		t.Fatalf("a request for another host: %d, want 421:\n%s", code, body)
	}
	// Its /metrics exports the namespace's gauges though no worker runs:
	// the alert rules see a namespace without a live worker.
	base += "metrics"
	if code, body := get(""); code != http.StatusOK || !strings.Contains(body, `keylane_namespace_workers{namespace="ui"} 0`) || !strings.Contains(body, `keylane_unowned_partitions{namespace="ui"} 2`) {
		t.Fatalf("the console's /metrics: %d\n%s", code, body)
	}
	if _, body := get(""); strings.Contains(body, "keylane_nats_connected") {
		t.Fatalf("the console exports keylane_nats_connected, which would silence KeylaneNoWorker's absent():\n%s", body)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ui ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ui did not stop with its context")
	}
}

// TestUIRefusesBadListen: a --listen that is not host:port is refused
// before anything connects.
func TestUIRefusesBadListen(t *testing.T) {
	for _, listen := range []string{"7781", "127.0.0.1"} {
		err := run(t.Context(), []string{"ui", "--nats", "nats://127.0.0.1:1", "--listen", listen}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "is not host:port") {
			t.Errorf("--listen %s: %v", listen, err)
		}
	}
	err := run(t.Context(), []string{"ui", "--nats", "nats://ops:s3cret@127.0.0.1:1", "--listen", "127.0.0.1:0"}, io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "nats://ops:***@127.0.0.1:1") {
		t.Errorf("a NATS URL with a password that does not connect: %v; want it named without the password", err)
	}
	if !isLoopback("127.0.0.1") || !isLoopback("::1") || !isLoopback("localhost") || isLoopback("0.0.0.0") || isLoopback("") || isLoopback("10.0.0.1") {
		t.Error("isLoopback is wrong")
	}
}
