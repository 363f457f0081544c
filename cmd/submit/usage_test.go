package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/keylane/keylane/internal/cmdutil"
)

// TestHelpAndBadFlags: -h on the command and on every subcommand prints
// usage and exits 0 without starting anything; a bad flag or an unknown
// command exits 2 with a message that names it.
func TestHelpAndBadFlags(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-h"}, 0, "usage: submit"},
		{[]string{"sale", "-h"}, 0, "-purchases"},
		{[]string{"call", "--help"}, 0, "-key"},
		{[]string{"send", "-h"}, 0, "-id"},
		{[]string{"bulk", "-h"}, 0, "-file"},
		{nil, 2, "usage: submit"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"sale", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"send", "--timeout", "soon"}, 2, `invalid value "soon" for flag -timeout`},
		{[]string{"bulk", "--bogus"}, 2, "flag provided but not defined: -bogus"},
	} {
		var out, errOut bytes.Buffer
		err := run(ctx, tc.args, &out, &errOut)
		if got := exitCode(err); got != tc.code {
			t.Errorf("submit %q: exit %d (%v), want %d\nstdout:%s\nstderr:%s", tc.args, got, err, tc.code, out.String(), errOut.String())
			continue
		}
		if said := out.String() + errOut.String(); !strings.Contains(said, tc.says) {
			t.Errorf("submit %q says\n%s\nwant it to say %q", tc.args, said, tc.says)
		}
	}
}

// exitCode is main's exit status for run's error.
func exitCode(err error) int { return cmdutil.Code(err) }
