// Package natsflags gives every keylane command the same way to reach a
// secured NATS: the flags and environment variables of the nats CLI for
// credentials and TLS, checked together, turned into nats.Options.
//
// The environment variables are the nats CLI's (NATS_CREDS, NATS_NKEY,
// NATS_USER, NATS_PASSWORD, NATS_CERT, NATS_KEY, NATS_CA,
// NATS_INBOX_PREFIX), so a shell set
// up for `nats` works for keylane too. A password belongs in NATS_PASSWORD
// or a --password-file: on the command line it shows in ps.
package natsflags

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// Auth holds the credential, TLS and inbox flags of one command. Its zero value
// asks for nothing: Options returns no options. Register fills it; it is
// not safe for concurrent use while the flags are parsed.
type Auth struct {
	Creds, NKey                  string
	User, Password, PasswordFile string
	TLSCA, TLSCert, TLSKey       string
	// InboxPrefix replaces nats.go's _INBOX for this connection's
	// replies, so a user's permissions can confine it to its own inboxes.
	InboxPrefix string
	// Token is a token to authenticate with; only a context (UseContext)
	// gives one.
	Token string
	// Context names a nats CLI context (UseContext); empty: none.
	Context string
}

// Register adds the flags to fs, each defaulting to its environment
// variable, and returns the Auth they fill.
func Register(fs *flag.FlagSet) *Auth {
	a := &Auth{}
	fs.StringVar(&a.Creds, "creds", os.Getenv("NATS_CREDS"), "NATS user credentials file (JWT and seed) (env NATS_CREDS)")
	fs.StringVar(&a.NKey, "nkey", os.Getenv("NATS_NKEY"), "NATS user NKey seed file (env NATS_NKEY)")
	fs.StringVar(&a.User, "user", os.Getenv("NATS_USER"), "NATS user name (env NATS_USER)")
	// The password's default is read in Options, not here: -h prints a
	// flag's default.
	fs.StringVar(&a.Password, "password", "", "NATS password; prefer env NATS_PASSWORD or --password-file, as a flag it shows in ps")
	fs.StringVar(&a.PasswordFile, "password-file", os.Getenv("NATS_PASSWORD_FILE"), "file holding the NATS password (env NATS_PASSWORD_FILE)")
	fs.StringVar(&a.TLSCA, "tls-ca", os.Getenv("NATS_CA"), "CA certificate file to verify the NATS server by (env NATS_CA)")
	fs.StringVar(&a.TLSCert, "tls-cert", os.Getenv("NATS_CERT"), "TLS client certificate file; needs --tls-key (env NATS_CERT)")
	fs.StringVar(&a.TLSKey, "tls-key", os.Getenv("NATS_KEY"), "TLS client key file; needs --tls-cert (env NATS_KEY)")
	fs.StringVar(&a.Context, "context", os.Getenv("NATS_CONTEXT"), "a saved nats CLI context: the URL and credentials of ~/.config/nats/context/NAME.json; flags given win over it (env NATS_CONTEXT)")
	fs.StringVar(&a.InboxPrefix, "inbox-prefix", os.Getenv("NATS_INBOX_PREFIX"), "prefix of this connection's reply subjects, e.g. _INBOX.a for a user that may only subscribe to _INBOX.a.> (env NATS_INBOX_PREFIX)")
	return a
}

// Set reports whether any credential, TLS or inbox setting was given (a
// context counts once UseContext has read it).
func (a *Auth) Set() bool {
	b := *a
	b.Context = ""
	return b != Auth{} || os.Getenv("NATS_PASSWORD") != ""
}

// Options checks the settings together and returns the nats.Options that
// apply them. It reads the password and NKey seed files, so that a missing
// file is an error here, before anything starts, not at connect.
func (a *Auth) Options() ([]nats.Option, error) {
	if a.Password == "" {
		a.Password = os.Getenv("NATS_PASSWORD")
	}
	var errs []error
	var ways []string
	for _, w := range []struct{ name, v string }{{"--creds", a.Creds}, {"--nkey", a.NKey}, {"--user", a.User}, {"a token", a.Token}} {
		if w.v != "" {
			ways = append(ways, w.name)
		}
	}
	if len(ways) > 1 {
		errs = append(errs, fmt.Errorf("give one way to authenticate, not %s", strings.Join(ways, " and ")))
	}
	if a.Password != "" && a.PasswordFile != "" {
		errs = append(errs, errors.New("give --password (NATS_PASSWORD) or --password-file, not both"))
	}
	if (a.Password != "" || a.PasswordFile != "") && a.User == "" {
		errs = append(errs, errors.New("a password needs --user (NATS_USER)"))
	}
	if (a.TLSCert == "") != (a.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert (NATS_CERT) and --tls-key (NATS_KEY) go together"))
	}
	for _, f := range []struct{ name, path string }{{"--creds", a.Creds}, {"--tls-ca", a.TLSCA}, {"--tls-cert", a.TLSCert}, {"--tls-key", a.TLSKey}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	password := a.Password
	if a.PasswordFile != "" {
		b, err := os.ReadFile(a.PasswordFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--password-file: %w", err))
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	var opts []nats.Option
	if a.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(a.NKey)
		if err != nil {
			errs = append(errs, fmt.Errorf("--nkey: %w", err))
		}
		opts = append(opts, o)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if a.Creds != "" {
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.User != "" {
		opts = append(opts, nats.UserInfo(a.User, password))
	}
	if a.Token != "" {
		opts = append(opts, nats.Token(a.Token))
	}
	if a.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(a.InboxPrefix))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	return opts, nil
}

// Refused adds to err the permissions violation the server last reported
// on nc, if any. A request the server refuses to pass on (a JetStream API
// call a user may not make) otherwise ends only with its timeout; the
// server says why asynchronously, on the connection. An err that may come
// of a server without JetStream ("no responders available") is checked
// with CheckJetStream and, if so, returned with ErrNoJetStream, which
// says how to start the server.
func Refused(nc *nats.Conn, err error) error {
	if err == nil || nc == nil {
		return err
	}
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && !errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("%w (the server refused: %v)", err, last)
	}
	if maybeNoJetStream(err) && !errors.Is(err, ErrNoJetStream) {
		// Asked last: a user who may not ask is refused, and that
		// refusal must not pass for the reason err has.
		if noJS := CheckJetStream(context.Background(), nc); noJS != nil {
			return fmt.Errorf("%w (%w)", noJS, err)
		}
	}
	return err
}
