package client

import (
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestNewRefusesAnIncompleteConfig: a Config without what the engine
// needs is refused by New, never a nil dereference at the first Submit.
func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	nc := connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	full := func() Config {
		return Config{
			Conn: nc, JS: js, MaxPending: 16, Namespace: "ns", Partitions: 2,
			Streams: []string{"NS_JOBS"}, Shard: func(int) int { return 0 },
			ResultsBucket: "NS_RESULTS", CheckStream: func(jetstream.StreamConfig) error { return nil },
		}
	}
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"no connection":  {func(c *Config) { c.Conn = nil }, "Conn"},
		"no JetStream":   {func(c *Config) { c.JS = nil }, "JS"},
		"no partitions":  {func(c *Config) { c.Partitions = 0 }, "Partitions"},
		"no streams":     {func(c *Config) { c.Streams = nil }, "Streams"},
		"no shard":       {func(c *Config) { c.Shard = nil }, "Shard"},
		"no check":       {func(c *Config) { c.CheckStream = nil }, "CheckStream"},
		"no results":     {func(c *Config) { c.ResultsBucket = "" }, "ResultsBucket"},
		"no namespace":   {func(c *Config) { c.Namespace = "" }, "Namespace"},
		"no max pending": {func(c *Config) { c.MaxPending = 0 }, "max ack pending"},
		"negative cork":  {func(c *Config) { c.BatchCork = -time.Millisecond }, "BatchCork"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := full()
			tc.edit(&cfg)
			c, err := New(cfg)
			if err == nil {
				c.Close()
				t.Fatalf("New accepted a Config with %s", name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want it to name %s", err, tc.want)
			}
		})
	}
	c, err := New(full())
	if err != nil {
		t.Fatalf("New with a full Config: %v", err)
	}
	c.Close()
}

func connect(t *testing.T) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, natstest.Start(t))
}
