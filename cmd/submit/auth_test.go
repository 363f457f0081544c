package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
)

// TestSecuredServer runs submit against a server with docs/security's
// accounts.conf: as client-a (user and password from the environment) a
// call reaches namespace a's worker; without a user, or with flags that do
// not go together, submit says what is wrong and does nothing.
func TestSecuredServer(t *testing.T) {
	for _, user := range []string{"admin", "client-a", "worker-a", "client-b", "worker-b", "sys"} {
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", user+"-secret")
	}
	s := natstest.StartConfig(t, "include ./accounts.conf\n", "../../docs/security/accounts.conf")
	url := s.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	nc := natstest.Connect(t, s, nats.UserInfo("worker-a", "worker-a-secret"), nats.CustomInboxPrefix("_INBOX.a"))
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "a", Partitions: 4, ReplyPrefix: "_INBOX.a."},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			return append([]byte("got "), job.Payload...), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(context.Background())

	call := []string{"call", "--nats", url, "--namespace", "a", "--inbox-prefix", "_INBOX.a", "--key", "k", "--payload", "hi", "--timeout", "10s"}
	t.Run("user from the environment", func(t *testing.T) {
		t.Setenv("NATS_USER", "client-a")
		t.Setenv("NATS_PASSWORD", "client-a-secret")
		var out bytes.Buffer
		if err := run(ctx, call, &out, &out); err != nil {
			t.Fatalf("call as client-a: %v", err)
		}
		if !strings.Contains(out.String(), "got hi") {
			t.Fatalf("call as client-a printed %q, want the worker's result", out.String())
		}
	})
	t.Run("password file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(file, []byte("client-a-secret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := run(ctx, append(call, "--user", "client-a", "--password-file", file), &out, &out); err != nil || !strings.Contains(out.String(), "got hi") {
			t.Fatalf("call with --password-file: %v, %q", err, out.String())
		}
	})
	t.Run("unauthenticated", func(t *testing.T) {
		err := run(ctx, call, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "connect to "+url) || !strings.Contains(err.Error(), "Authorization Violation") {
			t.Fatalf("call without a user: %v, want an authorization violation naming %s", err, url)
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		err := run(ctx, append(call, "--user", "client-a", "--password", "nope"), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
			t.Fatalf("call with a wrong password: %v, want an authorization violation", err)
		}
	})
	t.Run("another namespace's user", func(t *testing.T) {
		err := run(ctx, append(call, "--user", "client-b", "--password", "client-b-secret", "--timeout", "1s"), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), `Permissions Violation for Publish to "$JS.API.STREAM.INFO.A_JOBS"`) {
			t.Fatalf("call into namespace a as client-b: %v, want the server's refusal named", err)
		}
	})
	for _, tc := range []struct {
		name  string
		args  []string
		wrong string
	}{
		{"certificate without key", []string{"--tls-cert", "/nonexistent/cert.pem"}, "--tls-key"},
		{"password without user", []string{"--password", "x"}, "a password needs --user"},
		{"missing credentials file", []string{"--creds", "/nonexistent/user.creds"}, "--creds: stat /nonexistent/user.creds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(ctx, append(call, tc.args...), &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.wrong) {
				t.Fatalf("%v: %v, want an error naming %s", tc.args, err, tc.wrong)
			}
		})
	}
	t.Run("sale in process refuses credentials", func(t *testing.T) {
		err := run(ctx, []string{"sale", "--user", "client-a"}, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "--nats") {
			t.Fatalf("sale --user without --nats: %v, want a refusal naming --nats", err)
		}
	})
}
