// Package embedded runs a nats-server with JetStream inside the current
// process, so keylane works with nothing else installed.
package embedded

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says where the embedded server listens and stores.
type Config struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free port. Defaults to 4222 when zero.
	Port int
	// StoreDir holds JetStream's files. Required: keylane's promises depend
	// on jobs being on disk.
	StoreDir string
	// SyncAlways makes the server fsync every write before acknowledging it
	// (nats-server's sync_interval: always). Defaults to false, the server's
	// own default of a periodic sync.
	SyncAlways bool
	// ServerName names the server in logs. Defaults to "keylane-embedded".
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept connections.
	// Defaults to 10s.
	ReadyTimeout time.Duration
}

// Start starts a server and waits until it accepts connections. The caller
// owns it: call Shutdown and then WaitForShutdown to stop it.
func Start(cfg Config) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded: StoreDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Port == 0 {
		cfg.Port = 4222
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "keylane-embedded"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: 1 << 20,
	}
	if cfg.SyncAlways {
		opts.SyncAlways = true
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(cfg.ReadyTimeout) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded: server on %s:%d not ready within %s", cfg.Host, cfg.Port, cfg.ReadyTimeout)
	}
	return s, nil
}
