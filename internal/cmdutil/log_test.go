package cmdutil

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	log, err := NewLogger(&b, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("one event", "partition", 3)
	var entry map[string]any
	if err := json.Unmarshal(b.Bytes(), &entry); err != nil || entry["msg"] != "one event" || entry["partition"] != 3.0 || entry["level"] != "INFO" {
		t.Fatalf("json line %q: %v", b.String(), err)
	}
	b.Reset()
	log, err = NewLogger(&b, "text", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("one event", "partition", 3)
	if got := b.String(); !strings.Contains(got, `level=INFO msg="one event" partition=3`) {
		t.Fatalf("text line %q", got)
	}
	if _, err := NewLogger(&b, "xml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Fatalf("NewLogger(xml): %v, want an error naming --log-format", err)
	}
}
