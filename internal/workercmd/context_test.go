package workercmd

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestParseContext: --context NAME (or NATS_CONTEXT) takes the URL and
// credentials of the nats CLI's saved context; --nats given wins over its
// URL; an unknown context is a usage error.
func TestParseContext(t *testing.T) {
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	for _, name := range []string{"NATS_URL", "NATS_CONTEXT", "NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_NKEY"} {
		t.Setenv(name, "")
	}
	if err := os.MkdirAll(filepath.Join(cfg, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"url": "nats://n1:4222,nats://n2:4222", "user": "worker-a", "password": "pw"})
	if err := os.WriteFile(filepath.Join(cfg, "nats", "context", "prod.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (Config, error) {
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return Parse(fs, append(args, "--log-level", "error"))
	}
	c, err := parse("--context", "prod")
	if err != nil || c.URL != "nats://n1:4222,nats://n2:4222" || len(c.Auth) != 1 || c.Worker.Topology.Replicas != 3 {
		t.Fatalf("--context prod: URL %q, %d auth options, replicas %d, %v", c.URL, len(c.Auth), c.Worker.Topology.Replicas, err)
	}
	t.Setenv("NATS_CONTEXT", "prod")
	if c, err = parse("--nats", "nats://elsewhere:4222"); err != nil || c.URL != "nats://elsewhere:4222" {
		t.Fatalf("NATS_CONTEXT=prod --nats elsewhere: URL %q, %v", c.URL, err)
	}
	var usage *UsageError
	if _, err = parse("--context", "nope"); err == nil || !errors.As(err, &usage) {
		t.Fatalf("--context nope: %v, want a usage error", err)
	}
}
