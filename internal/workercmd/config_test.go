package workercmd

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, name := range []string{"NATS_URL", "KEYLANE_REPLICAS", "KEYLANE_PING_INTERVAL", "KEYLANE_LOG_LEVEL", "KEYLANE_WORKER_ID", "KEYLANE_DRAIN", "KEYLANE_LEASE_TTL", "KEYLANE_ACK_WAIT", "KEYLANE_MAX_KEY_BACKLOG", "KEYLANE_DELAYS",
		"NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE", "NATS_CA", "NATS_CERT", "NATS_KEY", "NATS_INBOX_PREFIX"} {
		t.Setenv(name, "")
	}
	for _, tc := range []struct {
		name     string
		args     []string
		replicas int
		err      string
	}{
		{"defaults", nil, 0, ""},
		{"a cluster has 3 replicas", []string{"--nats", "nats://a:4222,nats://b:4222"}, 3, ""},
		{"replicas given win", []string{"--nats", "nats://a:4222,nats://b:4222", "--replicas", "1"}, 1, ""},
		{"ping must be positive", []string{"--ping-interval", "0"}, 0, "--ping-interval"},
		{"negative ping", []string{"--ping-interval", "-1s"}, 0, "--ping-interval"},
		{"negative drain", []string{"--drain", "-1s"}, 0, "--drain"},
		{"zero drain", []string{"--drain", "0"}, 0, "--drain"},
		{"negative lease TTL", []string{"--lease-ttl", "-1s"}, 0, "--lease-ttl"},
		{"zero lease TTL", []string{"--lease-ttl", "0"}, 0, "--lease-ttl"},
		{"negative ack wait", []string{"--ack-wait", "-5s"}, 0, "--ack-wait"},
		{"zero ack wait", []string{"--ack-wait", "0s"}, 0, "--ack-wait"},
		{"unknown log level", []string{"--log-level", "loud"}, 0, `--log-level "loud": want debug, info, warn or error`},
		{"a key backlog cap", []string{"--max-key-backlog", "1000"}, 0, ""},
		{"negative key backlog cap", []string{"--max-key-backlog", "-1"}, 0, "--max-key-backlog"},
		{"delayed jobs", []string{"--delays"}, 0, ""},
		{"delays exclude a backlog cap", []string{"--delays", "--max-key-backlog", "10"}, 0, "cannot be combined"},
		{"a user for a server", []string{"--nats", "nats://a:4222", "--user", "u", "--password", "p"}, 0, ""},
		{"credentials need --nats", []string{"--user", "u", "--password", "p"}, 0, "are for a server given with --nats"},
		{"a certificate needs its key", []string{"--nats", "nats://a:4222", "--tls-cert", "c.pem"}, 0, "--tls-key"},
		{"test-only flags are not the worker's", []string{"--hold", "1ms"}, 0, "not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("worker", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c, err := Parse(fs, tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) = %v; want an error about %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Worker.Topology.Replicas != tc.replicas || c.Worker.ID == "" || c.Worker.Logger == nil {
				t.Fatalf("Parse(%q): replicas %d, ID %q, logger %v; want replicas %d, an ID and a logger",
					tc.args, c.Worker.Topology.Replicas, c.Worker.ID, c.Worker.Logger, tc.replicas)
			}
		})
	}
}

// TestLogLevel: --log-level (or KEYLANE_LOG_LEVEL) sets the worker's
// logger's level; debug turns on the per-job events.
func TestLogLevel(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		env   string
		debug bool
	}{
		{nil, "", false},
		{[]string{"--log-level", "debug"}, "", true},
		{nil, "debug", true},
		{[]string{"--log-level", "info"}, "debug", false},
	} {
		t.Setenv("KEYLANE_LOG_LEVEL", tc.env)
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		c, err := Parse(fs, tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Worker.Logger.Enabled(context.Background(), slog.LevelDebug); got != tc.debug {
			t.Errorf("Parse(%q) with KEYLANE_LOG_LEVEL=%q: DEBUG on %v, want %v", tc.args, tc.env, got, tc.debug)
		}
	}
}

// TestBadEnvironmentIsRefused: a variable the flag would refuse is a
// usage error naming it, never silently the default (KEYLANE_SYNC_ALWAYS
// =true ran without fsync, KEYLANE_LEASE_TTL=10 with 10s); a good one is
// read through the flag's parser (true for a boolean).
func TestBadEnvironmentIsRefused(t *testing.T) {
	for _, tc := range []struct{ name, value, says string }{
		{"KEYLANE_LEASE_TTL", "10", "KEYLANE_LEASE_TTL"},
		{"KEYLANE_SYNC_ALWAYS", "yes", "KEYLANE_SYNC_ALWAYS"},
		{"KEYLANE_MAX_KEY_BACKLOG", "1k", "KEYLANE_MAX_KEY_BACKLOG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			fs := flag.NewFlagSet("worker", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			_, err := Parse(fs, nil)
			var usage *UsageError
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%s=%s: %v; want a usage error naming it", tc.name, tc.value, err)
			}
		})
	}
	t.Setenv("KEYLANE_SYNC_ALWAYS", "true")
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	c, err := Parse(fs, nil)
	if err != nil || !c.SyncAlways {
		t.Fatalf("KEYLANE_SYNC_ALWAYS=true: sync %v, %v; want on", c.SyncAlways, err)
	}
}

// TestOutcomeBatchFlag: --outcome-batch (or KEYLANE_OUTCOME_BATCH) sets
// WorkerConfig.OutcomeBatch; unset, the worker picks by replicas (0), or
// 16 with --sync-always (the embedded server fsyncs every write).
func TestOutcomeBatchFlag(t *testing.T) {
	t.Setenv("KEYLANE_OUTCOME_BATCH", "")
	for _, tc := range []struct {
		env  string
		args []string
		want int
	}{
		{"", nil, 0},
		{"", []string{"--outcome-batch", "16"}, 16},
		{"-1", nil, -1},
		{"", []string{"--sync-always"}, 16},
		{"", []string{"--sync-always", "--outcome-batch", "0"}, 0},
		{"4", []string{"--sync-always"}, 4},
	} {
		t.Setenv("KEYLANE_OUTCOME_BATCH", tc.env)
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c, err := Parse(fs, tc.args)
		if err != nil || c.Worker.OutcomeBatch != tc.want {
			t.Fatalf("env %q args %q: OutcomeBatch %d, %v; want %d", tc.env, tc.args, c.Worker.OutcomeBatch, err, tc.want)
		}
	}
}
