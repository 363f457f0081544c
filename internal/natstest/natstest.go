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
