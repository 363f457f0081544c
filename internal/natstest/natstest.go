// Package natstest starts real, in-process NATS servers for tests.
package natstest

import (
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Option changes how Start runs a server.
type Option func(*embedded.Config)

// WithStoreDir keeps the server's store in dir instead of a fresh temporary
// directory, so a server started again on dir finds what the first one
// stored.
func WithStoreDir(dir string) Option { return func(c *embedded.Config) { c.StoreDir = dir } }

// WithPort listens on port instead of a free one, so a restarted server is
// found at its old address.
func WithPort(port int) Option { return func(c *embedded.Config) { c.Port = port } }

// WithServerName names the server; the name defaults to the test's.
func WithServerName(name string) Option { return func(c *embedded.Config) { c.ServerName = name } }

// Start runs a JetStream server, by default on a free loopback port with
// its store in a temporary directory, and stops it when the test ends.
// Stopping it earlier (Shutdown, WaitForShutdown) is fine.
func Start(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	cfg := embedded.Config{Port: -1, ServerName: t.Name()}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.StoreDir == "" {
		cfg.StoreDir = t.TempDir()
	}
	s, err := embedded.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect opens a connection to s that is closed when the test ends. It
// reconnects forever; opts come after that default and may change it.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, opts...)
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
