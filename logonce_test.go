package keylane

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
)

// One malformed message is one event: one log line says it was
// dead-lettered, and why.
func TestMalformedMessageIsLoggedOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	var logs syncBuffer
	w := e.worker("w1", echo(), func(c *WorkerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	e.waitOwned(w)
	if _, err := e.js.PublishMsg(ctx(t), &nats.Msg{Subject: partition.Subject(e.ns, 1, ""), Data: []byte("no key header")}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "the malformed message dead-lettered", func() bool {
		return len(e.deadLetters()) == 1 && w.Stats().DeadLettered == 1
	})
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "dead-lettered") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "malformed") || !strings.Contains(lines[0], "level=WARN") {
		t.Fatalf("%d log lines for one malformed message, want 1 WARN saying malformed:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}
