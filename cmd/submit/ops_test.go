package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/otlptest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestVersion: `submit version` and `submit --version` print the
// command's version and Go's.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "submit ") || !strings.Contains(out.String(), runtime.Version()) {
			t.Errorf("submit %q: %v\n%s%s", args, err, out.String(), errOut.String())
		}
	}
}

// TestUsageErrorsExitTwo: a command line submit refuses for what it says
// exits 2 (docs/commands.md), before anything connects or starts.
func TestUsageErrorsExitTwo(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_CONTEXT", "")
	nowhere := "nats://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"send", "--key", "k"}, "--nats"},
		{[]string{"bulk"}, "--nats"},
		{[]string{"sale", "--skew", "0.5"}, "--skew"},
		{[]string{"sale", "--max-key-backlog", "5", "--nats", nowhere}, "--max-key-backlog"},
		{[]string{"send", "--key", "k", "--nats", nowhere, "--otlp-endpoint", "ftp://collector"}, "--otlp-endpoint"},
		{[]string{"sale", "--otlp-endpoint", "http://127.0.0.1:4318"}, "--otlp-endpoint"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errOut)
		if code := exitCode(err); code != 2 || !strings.Contains(out.String()+errOut.String()+errString(err), tc.says) {
			t.Errorf("submit %q: exit %d (%v), want 2 naming %s", tc.args, code, err, tc.says)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestContextAndServiceName: `submit send --context NAME` reaches the
// server the nats CLI's saved context names, and OTEL_SERVICE_NAME names
// the service of the spans it exports (keylane-submit without it).
func TestContextAndServiceName(t *testing.T) {
	srv := natstest.Start(t)
	recv := otlptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "ctx", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	for _, name := range []string{"NATS_URL", "NATS_CONTEXT", "NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_NKEY"} {
		t.Setenv(name, "")
	}
	if err := os.MkdirAll(filepath.Join(cfg, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"url": srv.ClientURL()})
	if err := os.WriteFile(filepath.Join(cfg, "nats", "context", "local.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_SERVICE_NAME", "shop-checkout")
	var out bytes.Buffer
	if err := run(ctx, []string{"send", "--context", "local", "--namespace", "ctx", "--key", "sku:1", "--id", "named-1", "--otlp-endpoint", recv.URL}, &out, &out); err != nil || !strings.Contains(out.String(), "named-1") {
		t.Fatalf("submit send --context local: %v\n%s", err, out.String())
	}
	var services []string
	for _, s := range recv.Spans() {
		services = append(services, s.Service)
	}
	if len(services) == 0 || services[0] != "shop-checkout" {
		t.Fatalf("spans exported with services %v, want shop-checkout (OTEL_SERVICE_NAME)", services)
	}
}
