// Package natstest starts real, in-process NATS servers for tests.
package natstest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keylane/keylane/embedded"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// StreamMsgs returns every message stored in the stream name now, in
// sequence order; gaps (deleted messages) are skipped. It fails the test on
// any other error. Each request has its own deadline: one for the whole
// read failed a loaded machine's read of a few thousand dead letters
// (e2e TestHostileWire, "context deadline exceeded" at message ~1500).
func StreamMsgs(t testing.TB, js jetstream.JetStream, name string) []*jetstream.RawStreamMsg {
	t.Helper()
	req := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	ctx, cancel := req()
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		ctx, cancel := req()
		m, err := s.GetMsg(ctx, seq)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream %s, message %d: %v", name, seq, err)
		}
		out = append(out, m)
	}
	return out
}

// StartConfig runs a JetStream server from a configuration file's text, on
// a free loopback port with its store in a temporary directory, and stops
// it when the test ends. conf is written next to copies of files, so it
// may include them by base name (include ./accounts.conf).
func StartConfig(t testing.TB, conf string, files ...string) *server.Server {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.JetStream, opts.StoreDir = true, filepath.Join(dir, "jetstream")
	opts.NoSigs, opts.NoLog = true, true
	if opts.ServerName == "" {
		opts.ServerName = t.Name()
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("natstest: server not ready for connections")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// StartNoJetStream runs a nats-server without JetStream, as `nats-server`
// without -js does, until the test ends: the commands' tests check that
// each says JetStream is off and how to start it.
func StartNoJetStream(t testing.TB) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}
