package cmdutil

import (
	"flag"
	"io"
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
