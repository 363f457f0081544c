package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keylane/keylane/internal/cmdutil"
)

// TestHelpAndBadFlags: -h on the command and on every subcommand prints
// usage and exits 0, before connecting to anything; a bad flag or an
// unknown subcommand exits 2 with a message that names it.
func TestHelpAndBadFlags(t *testing.T) {
	ctx := context.Background()
	nowhere := "nats://127.0.0.1:1" // nothing listens: a connect attempt would fail with exit 1
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-h"}, 0, "usage: keylane"},
		{[]string{"help"}, 0, "usage: keylane"},
		{[]string{"repartition", "-h"}, 0, "-to"},
		{[]string{"adopt", "--help"}, 0, "-epoch"},
		{[]string{"leaders", "-h"}, 0, "-spread"},
		{[]string{"status", "-h"}, 0, "-watch"},
		{[]string{"dead", "-h"}, 0, "usage: keylane dead"},
		{[]string{"dead", "list", "-h"}, 0, "-limit"},
		{[]string{"dead", "redrive", "-h"}, 0, "-all"},
		{[]string{"state", "-h"}, 0, "usage: keylane state get KEY"},
		{[]string{"state", "get", "-h"}, 0, "-json"},
		{[]string{"job", "-h"}, 0, "-key"},
		{[]string{"namespace", "-h"}, 0, "usage: keylane namespace <list|delete>"},
		{[]string{"namespace", "delete", "-h"}, 0, "-force"},
		{[]string{"state", "put", "--nats", nowhere}, 2, `unknown state command "put"`},
		{[]string{"namespace", "drop", "--nats", nowhere}, 2, `unknown namespace command "drop"`},
		{nil, 2, "usage: keylane"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"repartition", "--bogus", "--nats", nowhere}, 2, "flag provided but not defined: -bogus"},
		{[]string{"status", "--watch", "soon", "--nats", nowhere}, 2, `invalid value "soon" for flag -watch`},
		{[]string{"dead"}, 2, "usage: keylane dead"},
		{[]string{"dead", "nope", "--nats", nowhere}, 2, `unknown dead-letter command "nope"`},
		{[]string{"dead", "list", "--bogus", "--nats", nowhere}, 2, "flag provided but not defined: -bogus"},
	} {
		var out, errOut bytes.Buffer
		err := run(ctx, tc.args, &out, &errOut)
		if got := exitCode(err); got != tc.code {
			t.Errorf("keylane %q: exit %d (%v), want %d\nstdout:%s\nstderr:%s", tc.args, got, err, tc.code, out.String(), errOut.String())
			continue
		}
		if said := out.String() + errOut.String() + errText(err); !strings.Contains(said, tc.says) {
			t.Errorf("keylane %q says\n%s\nwant it to say %q", tc.args, said, tc.says)
		}
	}
}

// errText is what main prints for err: nothing for an exit explained
// already.
func errText(err error) string {
	var exit exitError
	if err == nil || errors.As(err, &exit) {
		return ""
	}
	return err.Error()
}

// exitCode is main's exit status for run's error.
func exitCode(err error) int { return cmdutil.Code(err) }
