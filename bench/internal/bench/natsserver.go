package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/natscluster"
	"github.com/nats-io/nats.go"
)

// natsServerBinary returns a nats-server executable of the version this
// program was built with, so the separate server runs the same code as the
// embedded one (natscluster.Binary builds and caches it).
func natsServerBinary(ctx context.Context) (string, error) {
	bin, err := natscluster.Binary(ctx)
	if err != nil {
		return "", fmt.Errorf("bench: %w (or pass --nats-server)", err)
	}
	return bin, nil
}

// natsServer is a nats-server process with JetStream on a free loopback
// port and a store in a fresh directory.
type natsServer struct {
	*child
	URL string
	dir string
}

func startNATSServer(ctx context.Context, bin string, syncAlways bool) (*natsServer, error) {
	dir, err := os.MkdirTemp("", "keylane-bench-nats-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		s, err := tryNATSServer(ctx, bin, dir, syncAlways)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func tryNATSServer(ctx context.Context, bin, dir string, syncAlways bool) (*natsServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	sync := ""
	if syncAlways {
		sync = "sync_interval: always"
	}
	conf := fmt.Sprintf("listen: \"127.0.0.1:%d\"\njetstream { store_dir: %q, %s }\n", port, filepath.Join(dir, "js"), sync)
	profDir := os.Getenv("KEYLANE_BENCH_CPUPROFILE")
	profPort := 0
	if profDir != "" {
		// The server's profiling port, written to DIR/server-<port>.port so
		// that a profile of the sale can be fetched from outside
		// (http://127.0.0.1:PORT/debug/pprof/profile?seconds=N).
		if profPort, err = freePort(); err != nil {
			return nil, err
		}
		conf += fmt.Sprintf("prof_port: %d\n", profPort)
	}
	file := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	c, err := startChild(ctx, "", bin, "-c", file)
	if err != nil {
		return nil, err
	}
	s := &natsServer{child: c, URL: fmt.Sprintf("nats://127.0.0.1:%d", port), dir: dir}
	if profPort != 0 {
		_ = os.WriteFile(filepath.Join(profDir, fmt.Sprintf("server-%d.port", port)), []byte(strconv.Itoa(profPort)), 0o644)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		nc, err := nats.Connect(s.URL, nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			return s, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("bench: nats-server exited: %s", c.out)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.stop(time.Second)
			return nil, errors.Join(fmt.Errorf("bench: nats-server not ready: %w", err), ctx.Err())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// Stop stops the server and removes its store.
func (s *natsServer) Stop() {
	s.stop(10 * time.Second)
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// binaryVersion runs bin --version and returns its first line.
func binaryVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}
