package natsflags

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testcerts"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// The flags are proved against real servers: a TLS server that verifies
// client certificates, an NKey server and an operator-mode (JWT) server.
// Each test connects with the options Auth builds from the flags, and is
// refused with the wrong CA, no certificate, or a key the server does not
// know.

// connect builds the options from args and dials url once, without
// reconnect attempts.
func connect(t *testing.T, url string, args ...string) (*nats.Conn, error) {
	t.Helper()
	opts, err := parse(t, args...).Options()
	if err != nil {
		t.Fatalf("Options(%q): %v", args, err)
	}
	opts = append(opts, nats.Timeout(5*time.Second), nats.NoReconnect())
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTLSAgainstServer(t *testing.T) {
	dir := t.TempDir()
	p, other := testcerts.New(t, dir, "keylane"), testcerts.New(t, dir, "other")
	s := natstest.StartConfig(t, fmt.Sprintf("tls {\n cert_file: %q\n key_file: %q\n ca_file: %q\n verify: true\n timeout: 5\n}\n", p.ServerCert, p.ServerKey, p.CA))
	url := s.ClientURL()

	if _, err := connect(t, url, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey); err != nil {
		t.Fatalf("mutual TLS with the server's CA and a client certificate: %v", err)
	}
	var unknownCA x509.UnknownAuthorityError
	if _, err := connect(t, url, "--tls-ca", other.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey); !errors.As(err, &unknownCA) {
		t.Errorf("another CA: %v; want the server's certificate refused as signed by an unknown authority", err)
	}
	if _, err := connect(t, url, "--tls-ca", p.CA); err == nil {
		t.Error("no client certificate: connected; want the server to refuse it")
	}
	if _, err := connect(t, url, "--tls-ca", p.CA, "--tls-cert", other.ClientCert, "--tls-key", other.ClientKey); err == nil {
		t.Error("a client certificate of another CA: connected; want the server to refuse it")
	}
}

func TestNKeyAgainstServer(t *testing.T) {
	dir := t.TempDir()
	seedFile := func(name string) (pub, path string) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ = kp.PublicKey()
		seed, _ := kp.Seed()
		return pub, writeFile(t, dir, name, string(seed))
	}
	pub, known := seedFile("known.nk")
	_, unknown := seedFile("unknown.nk")
	s := natstest.StartConfig(t, fmt.Sprintf("authorization {\n users = [ { nkey: %q } ]\n}\n", pub))

	if _, err := connect(t, s.ClientURL(), "--nkey", known); err != nil {
		t.Fatalf("--nkey with the user's seed: %v", err)
	}
	if _, err := connect(t, s.ClientURL(), "--nkey", unknown); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("--nkey with an unknown seed: %v; want %v", err, nats.ErrAuthorization)
	}
	if _, err := connect(t, s.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("no credentials: %v; want %v", err, nats.ErrAuthorization)
	}
}

func TestCredsAgainstServer(t *testing.T) {
	dir := t.TempDir()
	must := func(kp nkeys.KeyPair, err error) nkeys.KeyPair {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	pubOf := func(kp nkeys.KeyPair) string { p, _ := kp.PublicKey(); return p }
	operator := must(nkeys.CreateOperator())
	opJWT, err := jwt.NewOperatorClaims(pubOf(operator)).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	account := must(nkeys.CreateAccount())
	acJWT, err := jwt.NewAccountClaims(pubOf(account)).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	system := must(nkeys.CreateAccount())
	sysJWT, err := jwt.NewAccountClaims(pubOf(system)).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	creds := func(name string, signer nkeys.KeyPair) string {
		user := must(nkeys.CreateUser())
		uc := jwt.NewUserClaims(pubOf(user))
		uJWT, err := uc.Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := user.Seed()
		b, err := jwt.FormatUserConfig(uJWT, seed)
		if err != nil {
			t.Fatal(err)
		}
		return writeFile(t, dir, name, string(b))
	}
	good := creds("good.creds", account)
	forged := creds("forged.creds", must(nkeys.CreateAccount())) // signed by an account the operator never issued
	opFile := writeFile(t, dir, "operator.jwt", opJWT)
	s := natstest.StartConfig(t, fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n %s: %q\n %s: %q\n}\n",
		opFile, pubOf(system), pubOf(account), acJWT, pubOf(system), sysJWT))

	if _, err := connect(t, s.ClientURL(), "--creds", good); err != nil {
		t.Fatalf("--creds of a user of the account: %v", err)
	}
	if _, err := connect(t, s.ClientURL(), "--creds", forged); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("--creds signed by an unknown account: %v; want an authorization violation", err)
	}
}
