package natsflags

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func parse(t *testing.T, args ...string) *Auth {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := Register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestOptions(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name  string
		args  []string
		opts  int
		wrong string // part of the error; "" when none
	}{
		{"nothing", nil, 0, ""},
		{"user and password", []string{"--user", "u", "--password", "p"}, 1, ""},
		{"user and password file", []string{"--user", "u", "--password-file", file}, 1, ""},
		{"creds", []string{"--creds", file}, 1, ""},
		{"mutual TLS", []string{"--tls-ca", file, "--tls-cert", file, "--tls-key", file}, 2, ""},
		{"inbox prefix", []string{"--inbox-prefix", "_INBOX.a"}, 1, ""},
		{"cert without key", []string{"--tls-cert", file}, 0, "--tls-cert (NATS_CERT) and --tls-key (NATS_KEY) go together"},
		{"key without cert", []string{"--tls-key", file}, 0, "go together"},
		{"two ways", []string{"--creds", file, "--user", "u"}, 0, "not --creds and --user"},
		{"password without user", []string{"--password", "p"}, 0, "a password needs --user"},
		{"password twice", []string{"--user", "u", "--password", "p", "--password-file", file}, 0, "not both"},
		{"missing creds", []string{"--creds", missing}, 0, "--creds: stat " + missing},
		{"missing password file", []string{"--user", "u", "--password-file", missing}, 0, "--password-file: open " + missing},
		{"not an nkey seed", []string{"--nkey", file}, 0, "--nkey:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := parse(t, tc.args...).Options()
			switch {
			case tc.wrong == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wrong != "" && (err == nil || !strings.Contains(err.Error(), tc.wrong)):
				t.Fatalf("error %v, want one containing %q", err, tc.wrong)
			case len(opts) != tc.opts:
				t.Fatalf("%d options, want %d", len(opts), tc.opts)
			}
		})
	}
}

func TestEnvDefaults(t *testing.T) {
	t.Setenv("NATS_USER", "u")
	t.Setenv("NATS_PASSWORD", "p")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_CA", ca)
	a := parse(t)
	if a.User != "u" || a.TLSCA != ca || !a.Set() {
		t.Fatalf("env not taken: %+v", a)
	}
	if _, err := a.Options(); err != nil || a.Password != "p" {
		t.Fatalf("NATS_PASSWORD not taken: %v, %+v", err, a)
	}
	if parse(t, "--user", "v").User != "v" {
		t.Fatal("a flag does not override its env variable")
	}
}

func TestPasswordHelpPointsAway(t *testing.T) {
	t.Setenv("NATS_PASSWORD", "hunter2")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Register(fs)
	if d := fs.Lookup("password").DefValue; d != "" {
		t.Fatalf("-h would show the password: default %q", d)
	}
	if u := fs.Lookup("password").Usage; !strings.Contains(u, "NATS_PASSWORD") || !strings.Contains(u, "--password-file") || !strings.Contains(u, "ps") {
		t.Fatalf("--password help does not steer away from the flag: %q", u)
	}
}
