package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestVersion: `worker --version` prints the command's version and Go's,
// and starts nothing.
func TestVersion(t *testing.T) {
	quiet(t)
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		var out bytes.Buffer
		if err := run(args, &out); err != nil || !strings.HasPrefix(out.String(), "worker ") || !strings.Contains(out.String(), runtime.Version()) {
			t.Errorf("worker %q: %v\n%s", args, err, out.String())
		}
	}
}
