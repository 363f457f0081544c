package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestUsageExitsTwo: a command line that lacks what keylane-pg needs, or
// asks for what it does not do, is refused with exit 2 and a message
// naming the flag, before it reads a file or connects to anything.
func TestUsageExitsTwo(t *testing.T) {
	for _, v := range []string{"NATS_URL", "DATABASE_URL", "KEYLANE_SQL", "KEYLANE_PG_IDLE_TIMEOUT"} {
		t.Setenv(v, "")
	}
	stderr := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	os.Stderr = devnull // the flag package's own message and the flags
	defer func() { os.Stderr = stderr }()
	nats, pg := "nats://127.0.0.1:1", "postgres://u@127.0.0.1:1/db"
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--postgres", pg, "--sql", "x.json"}, "--nats (env NATS_URL) is required"},
		{[]string{"--nats", nats, "--sql", "x.json"}, "--postgres (env DATABASE_URL) is required"},
		{[]string{"--nats", nats, "--postgres", pg}, "--sql (env KEYLANE_SQL) is required"},
		{[]string{"--nats", nats, "--postgres", pg, "--sql", "example/shop.json", "--data", "d"}, "--data is for an embedded server"},
		{[]string{"--nats", nats, "--postgres", pg, "--sql", "example/shop.json", "--idle-timeout", "10s"}, "--idle-timeout 10s: want it positive and below --lease-ttl 10s"},
		{[]string{"--nats", nats, "--postgres", pg, "--sql", "testdata/none.json"}, "--sql: open testdata/none.json"},
		{[]string{"--nats", nats, "--postgres", "postgres://u@[::1", "--sql", "example/shop.json"}, "--postgres"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
	} {
		err := run(tc.args)
		if code := exitCode(err); code != 2 || !strings.Contains(fmt.Sprint(err), tc.says) {
			t.Errorf("keylane-pg %q: exit %d, %v; want exit 2 saying %q", tc.args, code, err, tc.says)
		}
	}
	if err := run([]string{"-h"}); err != nil {
		t.Errorf("-h: %v; want exit 0", err)
	}
}
