// Package embedded runs a nats-server with JetStream inside the current
// process, so keylane works with nothing else installed.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrStoreInUse is returned by Start when another server, in this process
// or another, runs on the same StoreDir.
var ErrStoreInUse = errors.New("embedded: store directory in use by another server")

// ErrAddrInUse is returned by Start when something already listens on the
// address the server was to listen on.
var ErrAddrInUse = errors.New("address in use")

// Config says where the embedded server listens and stores.
type Config struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free port. Defaults to 4222 when zero.
	Port int
	// StoreDir holds JetStream's files. Required: keylane's promises depend
	// on jobs being on disk. One server at a time may use it: Start locks
	// it through the file keylane.lock inside.
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
//
// The server holds an exclusive lock on StoreDir (a flock on a file in it)
// until it has shut down, so a second server on the same directory, in this
// process or another, is refused with ErrStoreInUse instead of corrupting
// the first one's store. A Start right after WaitForShutdown of the previous
// server on the directory succeeds.
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
	lock, err := lockStore(cfg.StoreDir, cfg.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	if err := checkAddr(cfg.Host, cfg.Port); err != nil {
		lock.release()
		return nil, err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		lock.release()
		return nil, fmt.Errorf("embedded: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(cfg.ReadyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		lock.release()
		return nil, fmt.Errorf("embedded: server on %s:%d not ready within %s", cfg.Host, cfg.Port, cfg.ReadyTimeout)
	}
	lock.keepUntilShutdown(s)
	return s, nil
}

// checkAddr fails at once, naming the address, when host:port cannot be
// listened on; the server itself would only fail to become ready after
// ReadyTimeout. Port -1 (any free port) is not checked.
func checkAddr(host string, port int) error {
	if port < 0 {
		return nil
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("embedded: %s: %w by another server or process", addr, ErrAddrInUse)
	}
	if err != nil {
		return fmt.Errorf("embedded: cannot listen on %s: %w", addr, err)
	}
	return ln.Close()
}
