package cmdutil

import (
	"fmt"
	"io"
	"log/slog"
)

// LogFormats is the help text of a command's --log-format flag.
const LogFormats = "log line format: text (key=value, the default) or json (one JSON object a line, for a log shipper)"

// NewLogger returns a logger writing one line per event to w at level and
// above, in format: "text" (slog's key=value lines) or "json" (one JSON
// object a line, with time, level and msg keys). Another format is an
// error naming the flag.
func NewLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
