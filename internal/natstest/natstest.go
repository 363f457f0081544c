// Package natstest starts real, in-process NATS servers for tests.
package natstest

import (
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Start runs a JetStream server on a free loopback port with its store in a
// temporary directory, and stops it when the test ends.
func Start(t testing.TB) *server.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir(), ServerName: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect opens a connection to s that is closed when the test ends.
func Connect(t testing.TB, s *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(5*time.Second), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every few milliseconds until it is true or timeout
// passes, and fails the test with msg in that case. Call it only from the
// test goroutine.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
