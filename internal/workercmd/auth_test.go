package workercmd

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRunSecured runs the worker command against a server with
// docs/security's accounts.conf: as worker-a it sets up and serves
// namespace a; as worker-b it is refused namespace a, and says why.
func TestRunSecured(t *testing.T) {
	for _, user := range []string{"admin", "client-a", "worker-a", "client-b", "worker-b", "sys"} {
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", user+"-secret")
	}
	for _, name := range []string{"NATS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_NKEY", "NATS_INBOX_PREFIX", "KEYLANE_LOG_LEVEL"} {
		t.Setenv(name, "")
	}
	srv := natstest.StartConfig(t, "include ./accounts.conf\n", "../../docs/security/accounts.conf")
	admin, _ := jetstream.New(natstest.Connect(t, srv, nats.UserInfo("admin", "admin-secret")))

	run := func(ctx context.Context, user string) error {
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c, err := Parse(fs, []string{"--nats", srv.ClientURL(), "--namespace", "a", "--partitions", "4",
			"--inbox-prefix", "_INBOX.a", "--reply-prefix", "_INBOX.a.", "--user", user, "--log-level", "error"})
		if err != nil {
			t.Fatal(err)
		}
		return Run(ctx, c, nil)
	}

	t.Setenv("NATS_PASSWORD", "worker-b-secret")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := run(ctx, "worker-b"); err == nil || !strings.Contains(err.Error(), "Permissions Violation for Publish") {
		t.Fatalf("worker-b on namespace a: %v, want the server's refusal named", err)
	}

	t.Setenv("NATS_PASSWORD", "worker-a-secret")
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, "worker-a") }()
	for !leased(ctx, admin) {
		select {
		case err := <-done:
			t.Fatalf("worker-a stopped before taking a partition: %v", err)
		case <-ctx.Done():
			t.Fatal("worker-a did not take partition 0 of namespace a")
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("worker-a: %v", err)
	}
}

// leased reports whether partition 0 of namespace a has a lease: a worker
// set the namespace up and runs.
func leased(ctx context.Context, js jetstream.JetStream) bool {
	kv, err := js.KeyValue(ctx, "A_LEASES")
	if err != nil {
		return false
	}
	_, err = kv.Get(ctx, "p.0")
	return err == nil
}
