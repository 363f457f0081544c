// Package pgtest starts real PostgreSQL servers for tests and benchmarks
// (pg's, cmd/sale --postgres local, the bench module's rows): initdb into a
// fresh directory, postgres on a free port of 127.0.0.1, a readiness check
// with a deadline, and a stop on cleanup. Kill and Restart let a fault test
// SIGKILL the whole server (postmaster and backends) and bring it back on
// the same port and data, through crash recovery.
//
// The binaries are looked up in PATH, then in /usr/lib/postgresql/*/bin,
// where Debian's postgresql package puts them (the highest version wins);
// PGTEST_BINDIR overrides both. Postgres refuses to run as root: when the
// test runs as root (a fresh CI machine does), initdb and postgres run as
// the user nobody, and the test's temporary directory is opened for it to
// traverse.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane/internal/testwait"
)

// readyTimeout bounds a start, crash recovery included, on a loaded machine.
const readyTimeout = 60 * time.Second

// BinDir returns the directory holding initdb and postgres, or an error
// saying where it looked.
func BinDir() (string, error) {
	if d := os.Getenv("PGTEST_BINDIR"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Highest major version first: "9.6" < "15" needs a numeric sort.
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("pgtest: no initdb in PATH nor in /usr/lib/postgresql/*/bin: install Debian's postgresql package (scripts/test does)")
}

// Server is one PostgreSQL server with trust authentication on
// 127.0.0.1, superuser "postgres". It is safe for concurrent use.
type Server struct {
	// Port is the TCP port; it stays the same across Restart.
	Port int

	bin      string
	base     string // holds data/ and the log
	settings []string
	cred     *syscall.Credential // nil unless the test runs as root

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start initdb's a cluster into a fresh t.TempDir and starts it; the
// server is stopped on cleanup. settings are extra "name=value" server
// settings, passed as -c name=value after the harness's own, so they win.
func Start(t testing.TB, settings ...string) *Server {
	t.Helper()
	s, err := New(t.TempDir(), settings...)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgtest: stop: %v", err)
		}
	})
	return s
}

// New initdb's a cluster into dir (which must exist) and starts it. The
// caller stops it with Stop.
func New(dir string, settings ...string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, base: dir, settings: settings}
	if os.Geteuid() == 0 {
		if err := s.dropRoot(); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, err
	}
	if s.cred != nil {
		if err := os.Chown(data, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, err
		}
	}
	initdb := s.command("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	// A free port may be taken before postgres binds it: a few tries,
	// each on a new port.
	for try := 0; ; try++ {
		ports, err := testwait.FreePorts(1)
		if err != nil {
			return nil, err
		}
		s.Port = ports[0]
		if err = s.start(); err == nil {
			return s, nil
		}
		if try == 2 {
			return nil, err
		}
	}
}

// dropRoot arranges for the server to run as nobody, and opens the
// directories above base (the test's own temporary directories) for it to
// traverse.
func (s *Server) dropRoot() error {
	u, err := user.Lookup("nobody")
	if err != nil {
		return fmt.Errorf("running as root, postgres needs an unprivileged user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	// t.TempDir is base's parent's child; both are made 0700 for this test
	// alone. Opening them to traverse (not to list) lets nobody reach
	// data/. The bits are added, never set: base's parent may be /tmp
	// itself (cmd/sale's os.MkdirTemp), whose 1777 setting 0711 broke.
	for _, d := range []string{s.base, filepath.Dir(s.base)} {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if err := os.Chmod(d, fi.Mode()|0o011); err != nil {
			return err
		}
	}
	return nil
}

// command builds a command of the server's binaries, run as the
// unprivileged user when the test is root, with no PG* variable of the
// test's environment leaking in.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	env := []string{"LC_ALL=C", "HOME=" + s.base}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.Dir = s.base
	// Its own process group, so Kill reaches the backends too; killed if
	// the test process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	return cmd
}

// start runs postgres on s.Port and waits until it accepts a connection.
func (s *Server) start() error {
	args := []string{
		"-D", filepath.Join(s.base, "data"),
		"-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1",
		// No Unix socket: tests connect over TCP, and a socket path under
		// a long temporary directory can pass the 107-byte limit.
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
	}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	logf, err := os.OpenFile(filepath.Join(s.base, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	err = testwait.Poll(readyTimeout, func() error {
		select {
		case <-done:
			return testwait.Stop(fmt.Errorf("postgres exited during start-up: %s", s.logTail()))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgconn.Connect(ctx, s.URL("postgres", "postgres"))
		if err != nil {
			return err
		}
		return c.Close(ctx)
	})
	if err != nil {
		s.kill()
		return fmt.Errorf("postgres on port %d not ready: %w", s.Port, err)
	}
	return nil
}

// URL is a connection string for user to database db.
func (s *Server) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, s.Port, db)
}

// Kill SIGKILLs the server's whole process group — postmaster and
// backends, as a machine crash would, minus the loss of unsynced files —
// and waits for the postmaster to be gone.
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Restart starts the server again, on the same port and data, after Kill
// or Stop; postgres recovers from its log first. A backend of the killed
// server may hold the shared memory for a moment, so a refused start is
// tried again until the deadline.
func (s *Server) Restart() error {
	s.kill()
	return testwait.Poll(readyTimeout, s.start)
}

// Stop shuts the server down (fast shutdown: sessions are ended, nothing
// committed is lost), and kills it if it has not gone within the deadline.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
		return nil
	case <-time.After(readyTimeout):
		s.kill()
		return fmt.Errorf("postgres did not stop within %s: killed", readyTimeout)
	}
}

// LogFile is the path of the server's log (its stderr).
func (s *Server) LogFile() string { return filepath.Join(s.base, "postgres.log") }

// logTail returns the end of the server's log, for an error.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.base, "postgres.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}
