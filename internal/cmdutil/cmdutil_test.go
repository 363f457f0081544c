package cmdutil

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestNamespaceFollowsTheWorkersVariable(t *testing.T) {
	t.Setenv("KEYLANE_NAMESPACE", "")
	if got := Namespace(); got != "keylane" {
		t.Fatalf("unset: %q, want keylane", got)
	}
	t.Setenv("KEYLANE_NAMESPACE", "shop")
	if got := Namespace(); got != "shop" {
		t.Fatalf("KEYLANE_NAMESPACE=shop: %q", got)
	}
}

func TestParseExitStatuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want error
	}{{nil, nil}, {[]string{"-h"}, ExitError(0)}, {[]string{"--bogus"}, ExitError(2)}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		if got := Parse(fs, tc.args, io.Discard); got != tc.want {
			t.Errorf("Parse(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestParseFlagsAfterArguments: flags work after positional arguments
// (keylane dead show 1 --json), and "--" ends the flags.
func TestParseFlagsAfterArguments(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		json     bool
		from     uint64
		wantArgs []string
	}{
		{[]string{"1", "--json"}, true, 0, []string{"1"}},
		{[]string{"--from", "3", "1", "--json", "2"}, true, 3, []string{"1", "2"}},
		{[]string{"1", "--from=4"}, false, 4, []string{"1"}},
		{[]string{"1", "--", "--json"}, false, 0, []string{"1", "--json"}},
		{[]string{"--", "-1"}, false, 0, []string{"-1"}},
		{nil, false, 0, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "")
		from := fs.Uint64("from", 0, "")
		if err := Parse(fs, tc.args, io.Discard); err != nil {
			t.Fatalf("Parse(%q): %v", tc.args, err)
		}
		if *asJSON != tc.json || *from != tc.from || !slices.Equal(fs.Args(), tc.wantArgs) {
			t.Errorf("Parse(%q): json %v from %d args %q, want %v %d %q", tc.args, *asJSON, *from, fs.Args(), tc.json, tc.from, tc.wantArgs)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	if err := Parse(fs, []string{"1", "--bogus"}, io.Discard); err != ExitError(2) {
		t.Errorf("a bad flag after an argument: %v, want exit 2", err)
	}
}
