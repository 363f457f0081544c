package natsflags

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Context is a connection context as the nats CLI saves it (nats context
// save NAME): ~/.config/nats/context/NAME.json, or under
// $XDG_CONFIG_HOME/nats/context. The fields keylane uses are read; the
// others (JetStream domain and prefixes, nsc, colours) are not.
type Context struct {
	Description string `json:"description"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`
}

// ContextPath is the file of the nats CLI's context name.
func ContextPath(name string) (string, error) {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("--context %q: not a context name", name)
	}
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("--context %s: %w", name, err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "nats", "context", name+".json"), nil
}

// LoadContext reads the nats CLI's context name.
func LoadContext(name string) (Context, error) {
	var c Context
	path, err := ContextPath(name)
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, fmt.Errorf("--context %s: no such context: %s does not exist (nats context ls lists them)", name, path)
	}
	if err != nil {
		return c, fmt.Errorf("--context %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("--context %s: %s: %w", name, path, err)
	}
	return c, nil
}

// UseContext fills, from the context a.Context names (the --context flag
// or NATS_CONTEXT), every connection setting not given on fs's command
// line: the URL (into *url, the command's --nats, named urlFlag), the
// credentials, TLS files and inbox prefix. A flag given wins over the
// context; the context wins over the environment's defaults, as it was
// asked for by name. No context named: nothing changes. Call it after
// fs is parsed and before Options.
func (a *Auth) UseContext(fs *flag.FlagSet, urlFlag string, url *string) error {
	if a.Context == "" {
		return nil
	}
	c, err := LoadContext(a.Context)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	set := func(flagName string, dst *string, v string) {
		if v != "" && !given[flagName] {
			*dst = v
		}
	}
	set(urlFlag, url, c.URL)
	if !given["creds"] && !given["nkey"] && !given["user"] {
		// One way to authenticate: the context's replaces the
		// environment's.
		if c.Creds != "" || c.NKey != "" || c.User != "" || c.Token != "" {
			a.Creds, a.NKey, a.User, a.Token = c.Creds, c.NKey, c.User, c.Token
			if !given["password"] && !given["password-file"] {
				a.Password, a.PasswordFile = c.Password, ""
			}
		}
	} else if given["user"] && c.User == a.User {
		set("password", &a.Password, c.Password)
	}
	set("tls-ca", &a.TLSCA, c.CA)
	set("tls-cert", &a.TLSCert, c.Cert)
	set("tls-key", &a.TLSKey, c.Key)
	set("inbox-prefix", &a.InboxPrefix, c.InboxPrefix)
	return nil
}
