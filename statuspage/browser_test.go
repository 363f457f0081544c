package statuspage_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/statuspage"
)

// chromium returns the headless browser to run: $CHROMIUM, or chromium on
// the PATH. Without one the test is skipped, unless CI is set: CI must run
// it (scripts/test installs Debian's chromium).
func chromium(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("CHROMIUM"); b != "" {
		return b
	}
	b, err := exec.LookPath("chromium")
	if err == nil {
		return b
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI=%s and no chromium on the PATH: scripts/test installs it (apt-get install chromium): %v", os.Getenv("CI"), err)
	}
	t.Skipf("no chromium on the PATH (apt-get install chromium; under CI this fails): %v", err)
	return ""
}

// headless runs chromium headless on url with args and returns its
// standard output.
func headless(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// row returns the HTML of the table row with the given id in dom.
func row(t *testing.T, dom, id string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr id="` + regexp.QuoteMeta(id) + `"[^>]*>.*?</tr>`).FindString(dom)
	if m == "" {
		t.Fatalf("no row %s in the page:\n%s", id, dom)
	}
	return m
}

// TestPageInABrowser: a real browser renders the page of a worker that
// owns both partitions, with a backlog on one and a dead letter from the
// other, and shows the owner, the backlog and the dead letter.
func TestPageInABrowser(t *testing.T) {
	bin := chromium(t)
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID})
	url := hs.URL + "/keylane/"

	dom := string(headless(t, bin, url, "--dump-dom"))
	if strings.Contains(dom, `id="error"`) {
		t.Fatalf("the page shows an error:\n%s", dom)
	}
	for p := range partitions {
		r := row(t, dom, fmt.Sprintf("p%d", p))
		if !strings.Contains(r, `<td class="owner" data-label="owner">`+workerID+`</td>`) {
			t.Errorf("partition %d's row does not show owner %s:\n%s", p, workerID, r)
		}
	}
	if r := row(t, dom, fmt.Sprintf("p%d", blocked)); !strings.Contains(r, fmt.Sprintf(`<td class="num pending" data-label="backlog">%d</td>`, backlog)) || !strings.Contains(r, "backlog") {
		t.Errorf("partition %d's row does not show the backlog of %d:\n%s", blocked, backlog, r)
	}
	if !strings.Contains(dom, fmt.Sprintf(`<strong id="backlog">%d</strong>`, backlog)) {
		t.Errorf("the summary does not show a backlog of %d:\n%s", backlog, dom)
	}
	if !strings.Contains(dom, `<strong id="dead-count">1</strong>`) {
		t.Errorf("the summary does not show one dead letter:\n%s", dom)
	}
	dead := row(t, dom, "dead1")
	for _, want := range []string{s.poisonID, s.poisonKey, declined, workerID} {
		if !strings.Contains(dead, want) {
			t.Errorf("the dead letter's row does not show %q:\n%s", want, dead)
		}
	}
	if w := row(t, dom, "worker-"+workerID); !strings.Contains(w, `<code>`+workerID+`</code>`) || !strings.Contains(w, "ago") || !strings.Contains(w, `data-label="partitions">0, 1<`) || strings.Contains(w, `data-label="host">-<`) || strings.Contains(w, `data-label="version">-<`) {
		t.Errorf("the workers table does not show %s with its host, version, start, heartbeat and partitions:\n%s", workerID, w)
	}

	// A screenshot, for a person to look at: kept in
	// $STATUSPAGE_SCREENSHOT_DIR when set.
	dir := os.Getenv("STATUSPAGE_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "statuspage.png")
	headless(t, bin, url, "--screenshot="+shot, "--window-size=1200,900", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("the screenshot is not a PNG of a rendered page (%d bytes)", len(png))
	}
}
