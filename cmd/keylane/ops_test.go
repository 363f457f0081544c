package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go/jetstream"
)

// TestVersion: `keylane version` and `keylane --version` print the
// command's version and Go's; a build that sets the version with
// -ldflags -X prints that one.
func TestVersion(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if err := run(ctx, args, &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "keylane ") || !strings.Contains(out.String(), runtime.Version()) {
			t.Errorf("keylane %q: %v\n%s%s", args, err, out.String(), errOut.String())
		}
	}
	if testing.Short() {
		return
	}
	bin := filepath.Join(t.TempDir(), "keylane")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/keylane/keylane/internal/buildinfo.version=v9.8.7-test", ".")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		b, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(b), "keylane v9.8.7-test") {
			t.Errorf("built keylane %q: %v\n%s", args, err, b)
		}
	}
}

// TestUsageErrorsExitTwo: a command line keylane refuses for what it
// says (a missing or extra argument, flags that do not go together, a
// value out of range) exits 2, as docs/inspect.md says, before it
// connects, naming what is wrong.
func TestUsageErrorsExitTwo(t *testing.T) {
	ctx := context.Background()
	nowhere := "nats://127.0.0.1:1" // nothing listens: a connect attempt would exit 1
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"repartition"}, "--to"},
		{[]string{"repartition", "--to", "-1"}, "--to"},
		{[]string{"adopt", "--epoch", "zz"}, "--epoch"},
		{[]string{"status", "extra"}, "flags only"},
		{[]string{"status", "--watch", "-1s"}, "--watch"},
		{[]string{"state", "get"}, "want one key"},
		{[]string{"namespace", "delete"}, "name the namespace"},
		{[]string{"job"}, "usage: keylane job"},
		{[]string{"dead", "show"}, "want one dead-letter sequence"},
		{[]string{"dead", "show", "x"}, "not a dead-letter sequence"},
		{[]string{"dead", "purge", "1", "--all"}, "not both"},
		{[]string{"dead", "redrive", "--yes", "--dry-run", "1"}, "not both"},
	} {
		var out, errOut bytes.Buffer
		err := run(ctx, append(tc.args, "--nats", nowhere), &out, &errOut)
		said := out.String() + errOut.String() + errText(err)
		if code := exitCode(err); code != 2 || !strings.Contains(said, tc.says) {
			t.Errorf("keylane %q: exit %d (%v), want 2 saying %q\n%s", tc.args, code, err, tc.says, said)
		}
	}
}

// TestJSONWhenNothingFound: with --json a command that finds nothing
// prints JSON that says so (an empty list, or found: false), never prose,
// and exits as without --json.
func TestJSONWhenNothingFound(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(natstest.Connect(t, srv))
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "empty", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	for _, tc := range []struct {
		args []string
		code int
		want string // a JSON value's text
	}{
		{[]string{"dead", "list"}, 0, "[]"},
		{[]string{"dead", "show", "7"}, 3, `"found":false`},
		{[]string{"state", "get", "sku:404"}, 3, `"found":false`},
		{[]string{"job", "nope-1"}, 3, `"found":false`},
		{[]string{"namespace", "list", "--namespace", "x"}, 0, `"empty"`},
	} {
		var out, errOut bytes.Buffer
		err := run(ctx, append(tc.args, "--nats", url, "--namespace", "empty", "--json"), &out, &errOut)
		compact := strings.Join(strings.Fields(out.String()), "")
		if exitCode(err) != tc.code || !json.Valid(out.Bytes()) || !strings.Contains(compact, tc.want) {
			t.Errorf("keylane %q --json: exit %d (%v), want %d and JSON holding %s; stdout:\n%s", tc.args, exitCode(err), err, tc.code, tc.want, out.String())
		}
	}
}

// TestNamespaceList: `keylane namespace list` names every namespace on
// the server, with its partitions, backlog and dead letters; none is a
// line that says so (and [] with --json).
func TestNamespaceList(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := srv.ClientURL()
	var out bytes.Buffer
	if err := run(ctx, []string{"namespace", "list", "--nats", url, "--json"}, &out, &out); err != nil || strings.TrimSpace(out.String()) != "[]" {
		t.Fatalf("namespace list --json with none: %v\n%s", err, out.String())
	}
	js, _ := jetstream.New(natstest.Connect(t, srv))
	for _, ns := range []string{"shop", "shop-eu"} {
		if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: ns, Partitions: 4}); err != nil {
			t.Fatal(err)
		}
	}
	out.Reset()
	if err := run(ctx, []string{"namespace", "list", "--nats", url}, &out, &out); err != nil {
		t.Fatalf("namespace list: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "shop ") || !strings.HasPrefix(lines[2], "shop-eu ") || !strings.Contains(lines[1], "4") {
		t.Fatalf("namespace list: want a header and shop, shop-eu with 4 partitions:\n%s", out.String())
	}
}

// TestContext: --context NAME (or NATS_CONTEXT) reads natscli's saved
// context, ~/.config/nats/context/NAME.json, for the URL and the
// credentials; a flag given on the command line wins over it; an unknown
// context is an error naming the file.
func TestContext(t *testing.T) {
	for _, user := range []string{"admin", "client-a", "worker-a", "client-b", "worker-b", "sys"} {
		t.Setenv(strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD", user+"-secret")
	}
	srv := natstest.StartConfig(t, "include ./accounts.conf\n", "../../docs/security/accounts.conf")
	for _, name := range []string{"NATS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "NATS_NKEY", "NATS_INBOX_PREFIX", "NATS_CONTEXT"} {
		t.Setenv(name, "")
	}
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	dir := filepath.Join(home, ".config", "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name string, v map[string]string) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ops", map[string]string{"description": "the admin", "url": srv.ClientURL(), "user": "admin", "password": "admin-secret"})
	write("wrong", map[string]string{"url": srv.ClientURL(), "user": "admin", "password": "not-it"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"namespace", "list", "--context", "ops"}, &out, &out); err != nil {
		t.Fatalf("namespace list --context ops: %v\n%s", err, out.String())
	}
	t.Setenv("NATS_CONTEXT", "ops")
	out.Reset()
	if err := run(ctx, []string{"namespace", "list"}, &out, &out); err != nil {
		t.Fatalf("namespace list with NATS_CONTEXT=ops: %v\n%s", err, out.String())
	}
	t.Setenv("NATS_CONTEXT", "")
	// A flag given wins over the context: the wrong password is replaced.
	out.Reset()
	if err := run(ctx, []string{"namespace", "list", "--context", "wrong", "--password", "admin-secret"}, &out, &out); err != nil {
		t.Fatalf("namespace list --context wrong --password (right): %v\n%s", err, out.String())
	}
	out.Reset()
	err := run(ctx, []string{"namespace", "list", "--context", "wrong"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "Authorization Violation") || strings.Contains(err.Error(), "not-it") {
		t.Fatalf("namespace list --context wrong: %v, want the server's refusal", err)
	}
	// The flag's URL wins too: nothing listens there.
	err = run(ctx, []string{"namespace", "list", "--context", "ops", "--nats", "nats://127.0.0.1:1"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("namespace list --context ops --nats elsewhere: %v, want a connect error to the flag's URL", err)
	}
	err = run(ctx, []string{"namespace", "list", "--context", "nope"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "nope.json")) {
		t.Fatalf("namespace list --context nope: %v, want an error naming the file", err)
	}
}
