// Package redistest starts real redis-server processes for tests, on free
// ports of 127.0.0.1, and offers a TCP proxy that can cut a connection
// right after a given command reached the server.
//
// A server may require a password or ACL users (pass redis-server's own
// arguments, e.g. "--requirepass", "pw"): the start-up check takes a
// NOAUTH reply as proof the server is up. StartTLS starts one that speaks
// TLS only.
package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// Binary is the redis-server executable; REDIS_SERVER overrides it.
func Binary() string {
	if b := os.Getenv("REDIS_SERVER"); b != "" {
		return b
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return "/usr/bin/redis-server"
}

// Server is one redis-server process, without persistence unless its extra
// arguments turn it on. It is safe for concurrent use.
type Server struct {
	Addr string

	mu    sync.Mutex
	port  int
	dir   string
	extra []string
	tls   *TLS
	cmd   *exec.Cmd
	wait  chan struct{}
}

// Start starts a server on a free port, its working files in a fresh
// temporary directory that Stop removes. The server runs with --save ""
// --appendonly no, then extra: redis-server lets a later option override an
// earlier one, so "--appendonly", "yes" turns the log on.
func Start(extra ...string) (*Server, error) { return start(nil, extra) }

// TLS configures a server that accepts TLS connections only.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile, KeyFile string
	// CAFile holds the CA certificates that sign client certificates;
	// redis-server insists on one even when clients need none.
	CAFile string
	// ClientCerts makes the server require a client certificate signed
	// by CAFile (--tls-auth-clients yes).
	ClientCerts bool
	// Client is the configuration the start-up check dials with.
	Client *tls.Config
}

// StartTLS starts a server like Start, serving TLS only on its port
// (plain TCP is off).
func StartTLS(t TLS, extra ...string) (*Server, error) { return start(&t, extra) }

func start(t *TLS, extra []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		ports, err := testwait.FreePorts(1)
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{port: ports[0], dir: dir, extra: extra, tls: t, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: start: %w", lastErr)
}

func (s *Server) start() error {
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning"}
	if t := s.tls; t != nil {
		auth := "no"
		if t.ClientCerts {
			auth = "yes"
		}
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile,
			"--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", auth)
	}
	cmd := exec.Command(Binary(), append(args, s.extra...)...)
	if err := cmd.Start(); err != nil {
		return err
	}
	wait := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(wait)
	}()
	s.mu.Lock()
	s.cmd, s.wait = cmd, wait
	s.mu.Unlock()
	err := testwait.Poll(10*time.Second, func() error {
		select {
		case <-wait:
			return testwait.Stop(errors.New("redis-server exited during start (port taken?)"))
		default:
		}
		return ping(s.Addr, s.tls)
	})
	if err != nil {
		s.kill(syscall.SIGKILL)
		return fmt.Errorf("redis-server not ready: %w", err)
	}
	return nil
}

// ping sends PING and expects +PONG, or -NOAUTH from a server that
// requires a password: either way it is up.
func ping(addr string, t *TLS) error {
	var c net.Conn
	var err error
	if t != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, t.Client)
	} else {
		c, err = net.DialTimeout("tcp", addr, time.Second)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

func (s *Server) kill(sig syscall.Signal) {
	s.mu.Lock()
	cmd, wait := s.cmd, s.wait
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-wait
}

// PID returns the process ID of the running server, or 0 if none runs.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the process to exit: no shutdown, no
// save.
func (s *Server) Kill() { s.kill(syscall.SIGKILL) }

// Restart starts a fresh process on the same port. Without persistence it
// comes back empty.
func (s *Server) Restart() error {
	s.Kill()
	// The port may still be held by the old process for a moment.
	return testwait.Poll(10*time.Second, s.start)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}
