package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// TestHelpExitsZero: -h prints the flags and is not a failure, so a
// script that asks for help does not see exit status 1.
func TestHelpExitsZero(t *testing.T) {
	stderr := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	os.Stderr = devnull
	defer func() { os.Stderr = stderr }()
	for _, arg := range []string{"-h", "--help"} {
		if err := run([]string{arg}, io.Discard); err != nil {
			t.Errorf("run(%q) = %v; want nil (exit 0)", arg, err)
		}
	}
}

// TestBadFlagsExitTwo: a flag that does not exist or a value refused is a
// usage error, exit 2, with a message naming the flag; nothing starts.
func TestBadFlagsExitTwo(t *testing.T) {
	stderr := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	os.Stderr = devnull // the flag package's own message and the flags
	defer func() { os.Stderr = stderr }()
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"--drain", "-1s"}, "--drain must be positive"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"--lease-ttl", "soon"}, `invalid value "soon" for flag -lease-ttl`},
	} {
		err := run(tc.args, io.Discard)
		if code := exitCode(err); code != 2 || !strings.Contains(fmt.Sprint(err), tc.says) {
			t.Errorf("worker %q: exit %d, %v; want exit 2 saying %q", tc.args, code, err, tc.says)
		}
	}
}
