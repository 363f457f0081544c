package natscluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
)

// Module is the Go module nats-server is built from.
const Module = "github.com/nats-io/nats-server/v2"

// Binary returns a nats-server executable of the version this program was
// built with, so a separate server runs the same code as an embedded one.
// It builds it once with the go command from the module (go build inside
// this module, else go install module@version) and keeps it under the
// user cache directory, keyed by version; a version of "unknown" (no build
// info) is rebuilt every time. It is safe for concurrent use, also across
// processes: each build goes to its own directory and is renamed into
// place.
func Binary(ctx context.Context) (string, error) {
	version := ModuleVersion(Module)
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "keylane", "nats-server-"+version)
	bin := filepath.Join(dir, "nats-server")
	if _, err := os.Stat(bin); err == nil && version != "unknown" {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	built := filepath.Join(tmp, "nats-server")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", built, Module).CombinedOutput()
	if err != nil && version != "unknown" {
		cmd := exec.CommandContext(ctx, "go", "install", Module+"@"+version)
		cmd.Env = append(os.Environ(), "GOBIN="+tmp)
		var more []byte
		more, err = cmd.CombinedOutput()
		out = append(out, more...)
		built = filepath.Join(tmp, "nats-server")
	}
	if err != nil {
		return "", fmt.Errorf("natscluster: build nats-server %s: %w: %s", version, err, strings.TrimSpace(string(out)))
	}
	return bin, os.Rename(built, bin)
}

// ModuleVersion returns the version of module path this program was built
// with (following a replace), or "unknown".
func ModuleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				if d.Replace != nil {
					d = d.Replace
				}
				return d.Version
			}
		}
	}
	return "unknown"
}

var binary struct {
	sync.Mutex
	path string
}

// cachedBinary is Binary, run once per process when it succeeds.
func cachedBinary(ctx context.Context) (string, error) {
	binary.Lock()
	defer binary.Unlock()
	if binary.path != "" {
		return binary.path, nil
	}
	p, err := Binary(ctx)
	if err == nil {
		binary.path = p
	}
	return p, err
}
