package statuspage_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/statuspage"
)

// TestLookupJSON: status.json?job=ID and ?key=KEY carry the same
// look-ups as keylane job and keylane state get; bad input is an error
// in the look-up, the namespace's reading is served as ever.
func TestLookupJSON(t *testing.T) {
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID})
	lookup := func(q url.Values) *statuspage.Lookup {
		t.Helper()
		code, body, _ := get(t, http.MethodGet, hs.URL+"/keylane/status.json?"+q.Encode())
		var p statuspage.Page
		if err := json.Unmarshal([]byte(body), &p); err != nil || code != http.StatusOK || p.Status == nil || p.Lookup == nil {
			t.Fatalf("status.json?%s: %d %v\n%s", q.Encode(), code, err, body)
		}
		return p.Lookup
	}
	if l := lookup(url.Values{"job": {"count-2"}, "key": {s.countKey}}); l.Job == nil || l.Job.Where != keylane.FoundResults || string(l.Job.Result) != "counted 2" ||
		l.State == nil || string(l.State.Value) != "xx" || l.State.JobID != "count-2" || l.Revision == 0 || l.Error != "" {
		t.Fatalf("job count-2 with its key: %+v", l)
	}
	if l := lookup(url.Values{"job": {s.poisonID}}); l.Job == nil || l.Job.Dead == nil || !strings.Contains(l.Job.Error, declined) || l.State != nil {
		t.Fatalf("the dead-lettered job: %+v", l)
	}
	if l := lookup(url.Values{"job": {"never-1"}}); !l.JobNotFound || l.Job != nil || l.Error != "" {
		t.Fatalf("a job never submitted: %+v", l)
	}
	if l := lookup(url.Values{"key": {"sku:none"}}); !l.StateNotFound || l.State != nil || l.Error != "" {
		t.Fatalf("a key never written: %+v", l)
	}
	if l := lookup(url.Values{"job": {"a..b"}}); !strings.Contains(l.Error, "job ID") || l.Job != nil {
		t.Fatalf("a bad job ID: %+v", l)
	}
	if l := lookup(url.Values{"key": {""}}); !strings.Contains(l.Error, "empty") || l.State != nil {
		t.Fatalf("an empty key: %+v", l)
	}
}

// TestLookupsInABrowser: in a real browser the page lists the dead
// letters above the partitions when there are any, cuts a long key to
// fit with the whole in its title, and shows a job looked up by ID with
// its key's state and held outcomes, a key without state and a bad ID.
// With KEYLANE_SCREENSHOT=path it saves a screenshot of the look-up
// there (docs/status.png is made so).
func TestLookupsInABrowser(t *testing.T) {
	bin := chromium(t)
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID, Refresh: -1})
	base := hs.URL + "/keylane/"

	dom := string(headless(t, bin, base, "--dump-dom"))
	if d, p := strings.Index(dom, `<table id="dead">`), strings.Index(dom, `<table id="partitions">`); d < 0 || p < 0 || d > p {
		t.Fatalf("the dead letters (at %d) are not above the partitions (at %d):\n%s", d, p, dom)
	}
	dead := row(t, dom, "dead1")
	if !strings.Contains(dead, `title="`+s.poisonKey+`"`) || strings.Contains(dead, ">"+s.poisonKey+"<") || !strings.Contains(dead, "…") {
		t.Fatalf("the dead letter's long key is not cut with the whole in its title:\n%s", dead)
	}

	q := url.Values{"job": {"count-2"}, "key": {s.countKey}}
	dom = string(headless(t, bin, base+"?"+q.Encode(), "--dump-dom"))
	for _, want := range []string{`<strong id="lookup-where">results</strong>`, `"counted 2"`, `<p id="lookup-state">revision `, `value <code>"xx"</code>`, "count-1", `"counted 1"`, "2 held outcome(s)",
		`value="count-2"`, `value="` + s.countKey + `"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the look-up of count-2 and %s does not show %q:\n%s", s.countKey, want, section(dom))
		}
	}
	dom = string(headless(t, bin, base+"?job="+s.poisonID, "--dump-dom"))
	if sec := section(dom); !strings.Contains(sec, declined) || !strings.Contains(sec, `id="lookup-dead"`) {
		t.Errorf("the look-up of %s does not show its dead letter:\n%s", s.poisonID, sec)
	}
	dom = string(headless(t, bin, base+"?key=sku:none", "--dump-dom"))
	if sec := section(dom); !strings.Contains(sec, "has no state entry") {
		t.Errorf("the look-up of a key never written:\n%s", sec)
	}
	dom = string(headless(t, bin, base+"?job=a..b", "--dump-dom"))
	if sec := section(dom); !strings.Contains(sec, `id="lookup-error"`) || !strings.Contains(sec, "job ID") {
		t.Errorf("the look-up of a bad job ID:\n%s", sec)
	}
	if !strings.Contains(dom, `<table id="partitions">`) {
		t.Errorf("a bad look-up hid the namespace's reading:\n%s", dom)
	}

	shot := os.Getenv("KEYLANE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "status.png")
	} else if abs, err := filepath.Abs(shot); err == nil {
		shot = abs
	}
	headless(t, bin, base+"?"+q.Encode(), "--screenshot="+shot, "--window-size=1100,1000", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("the screenshot is not a PNG of a rendered page (%d bytes)", len(png))
	}
}

// section returns the look-up section of dom.
func section(dom string) string {
	return regexp.MustCompile(`(?s)<div id="lookup">.*?</div>\s*<p`).FindString(dom)
}

// TestKeyView: a key's look-up counts its jobs: queued (stored, not yet
// delivered) and delivered but not acknowledged (running or waiting to
// be retried), from one-job messages and from batch messages alike, and
// names its partition's owner.
func TestKeyView(t *testing.T) {
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID})
	keyView := func(js string, key string) *statuspage.KeyView {
		t.Helper()
		code, body, _ := get(t, http.MethodGet, js+"/keylane/status.json?key="+url.QueryEscape(key))
		var p statuspage.Page
		if err := json.Unmarshal([]byte(body), &p); err != nil || code != http.StatusOK || p.Lookup == nil || p.Lookup.KeyView == nil || p.Lookup.Error != "" {
			t.Fatalf("status.json?key=%s: %d %v\n%s", key, code, err, body)
		}
		return p.Lookup.KeyView
	}
	// The blocked key: its first job runs, three wait behind it.
	if kv := keyView(hs.URL, s.blockedKey); kv.Queued != backlog || kv.Delivered != 1 || kv.Owner != workerID || kv.Partition != blocked || kv.Cut {
		t.Fatalf("the blocked key: %+v, want %d queued, 1 running, owner %s", kv, backlog, workerID)
	}
	if kv := keyView(hs.URL, s.countKey); kv.Queued != 0 || kv.Delivered != 0 {
		t.Fatalf("a key whose jobs are done: %+v", kv)
	}

	// Batch messages (every Go client's jobs) in a namespace no worker
	// serves: all queued, counted by key.
	ctx := t.Context()
	if _, err := keylane.Setup(ctx, s.js, keylane.TopologyConfig{Namespace: "idle", Partitions: partitions}); err != nil {
		t.Fatal(err)
	}
	c, err := keylane.NewClient(ctx, natstest.Connect(t, s.srv), keylane.ClientConfig{Namespace: "idle"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var reqs []keylane.Request
	for i := range 5 {
		reqs = append(reqs, keylane.Request{Key: "sku:a", Payload: []byte("x")}, keylane.Request{Key: fmt.Sprintf("sku:b%d", i), Payload: []byte("y")})
	}
	if _, err := c.SubmitMany(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "sku:a", []byte("z")); err != nil {
		t.Fatal(err)
	}
	idle := serve(t, s.js, statuspage.Config{Namespace: "idle"})
	if kv := keyView(idle.URL, "sku:a"); kv.Queued != 6 || kv.Delivered != 0 || kv.Owner != "" {
		t.Fatalf("sku:a in a namespace without workers: %+v, want 6 queued", kv)
	}
}
