package nodeclient_test

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestREADMEExample runs the root README's Node.js example ("From other
// languages") as written, against a real server and the Go workers of
// namespace "keylane": only its import (the package's built dist, as npm
// install of this folder gives it) and its server address are replaced.
// It fails when the example no longer matches the client's API or prints
// no result.
func TestREADMEExample(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## From other languages")
	if !ok {
		t.Fatal(`README.md has no section "From other languages"`)
	}
	_, block, ok := strings.Cut(after, "```js\n")
	if !ok {
		t.Fatal(`README.md's "From other languages" has no js block`)
	}
	code, _, ok := strings.Cut(block, "```")
	if !ok {
		t.Fatal("README.md's js block does not end")
	}
	const addr = `"127.0.0.1:4222"`
	if !strings.Contains(code, `from "@keylane/client"`) || !strings.Contains(code, addr) {
		t.Fatalf("README.md's js block no longer imports @keylane/client and connects to %s:\n%s", addr, code)
	}
	l := startSale(t, "keylane")
	u, err := url.Parse(l.URL)
	if err != nil {
		t.Fatal(err)
	}
	dist, err := filepath.Abs("dist/cjs/index.js")
	if err != nil {
		t.Fatal(err)
	}
	code = strings.Replace(code, `"@keylane/client"`, `"`+filepath.ToSlash(dist)+`"`, 1)
	code = strings.Replace(code, addr, `"`+u.Host+`"`, 1)
	file := filepath.Join(t.TempDir(), "example.mjs")
	if err := os.WriteFile(file, []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, node, file)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README's example: %v\n%s", err, out.String())
	}
	if got := strings.TrimSpace(out.String()); got == "" {
		t.Fatal("the README's example printed nothing; want the call's result")
	} else {
		t.Logf("the README's example printed %q", got)
	}
}
