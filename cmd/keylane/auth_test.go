package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestSecuredServer runs `keylane leaders` against a server with
// docs/security's accounts.conf: as admin (from the environment) it
// works, without a user it is refused with the URL named, and a key
// without its certificate is refused before it connects.
func TestSecuredServer(t *testing.T) {
	for _, user := range []string{"admin", "client-a", "worker-a", "client-b", "worker-b", "sys"} {
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", user+"-secret")
	}
	for _, name := range []string{"NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_NKEY", "NATS_INBOX_PREFIX"} {
		t.Setenv(name, "")
	}
	srv := natstest.StartConfig(t, "include ./accounts.conf\n", "../../docs/security/accounts.conf")
	url := srv.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv, nats.UserInfo("admin", "admin-secret")))
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "a", Partitions: 4, ReplyPrefix: "_INBOX.a."}); err != nil {
		t.Fatal(err)
	}
	leaders := []string{"leaders", "--nats", url, "--namespace", "a"}

	t.Setenv("NATS_USER", "admin")
	t.Setenv("NATS_PASSWORD", "admin-secret")
	var out bytes.Buffer
	if err := run(ctx, leaders, &out, &out); err != nil || !strings.Contains(out.String(), "A_JOBS") {
		t.Fatalf("leaders as admin: %v\n%s", err, out.String())
	}

	t.Setenv("NATS_USER", "")
	t.Setenv("NATS_PASSWORD", "")
	err := run(ctx, leaders, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "connect to "+url) || !strings.Contains(err.Error(), "Authorization Violation") {
		t.Fatalf("leaders without a user: %v, want an authorization violation naming %s", err, url)
	}

	err = run(ctx, append(leaders, "--user", "admin", "--tls-key", "/nonexistent/key.pem"), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "--tls-cert (NATS_CERT) and --tls-key (NATS_KEY) go together") {
		t.Fatalf("leaders with a key but no certificate: %v", err)
	}
}
