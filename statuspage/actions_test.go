package statuspage_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// post sends form to url with the given Origin (none when empty).
func post(t *testing.T, u, origin string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// confirmForm GETs a confirmation page and returns its form's fields.
func confirmForm(t *testing.T, u string) url.Values {
	t.Helper()
	code, body, _ := get(t, http.MethodGet, u)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", u, code, body)
	}
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		form.Add(m[1], m[2])
	}
	if form.Get("token") == "" {
		t.Fatalf("the confirmation page %s has no token:\n%s", u, body)
	}
	return form
}

func deadLetters(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	n, _, _, err := keylane.DeadLetterSpan(t.Context(), js, ns)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestActionsNeedTheirConfirmation: an action is done only by a POST
// from this page's origin carrying the token its own confirmation page
// gave and the ticked box; anything else is refused and changes
// nothing. Without Config.Actions the page has no actions at all.
func TestActionsNeedTheirConfirmation(t *testing.T) {
	s := newScene(t)
	ro := serve(t, s.js, statuspage.Config{Namespace: ns})
	if code, _, _ := get(t, http.MethodGet, ro.URL+"/keylane/confirm?op=delete&seq=1"); code != http.StatusNotFound {
		t.Fatalf("a read-only page's confirm: %d, want 404", code)
	}
	if code, _ := post(t, ro.URL+"/keylane/action", "", url.Values{"op": {"delete"}, "seq": {"1"}}); code != http.StatusNotFound {
		t.Fatalf("a read-only page's action: %d, want 404", code)
	}
	if _, body, _ := get(t, http.MethodGet, ro.URL+"/keylane/"); strings.Contains(body, "confirm?") {
		t.Fatalf("a read-only page links to an action:\n%s", body)
	}

	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Actions: true})
	base := hs.URL + "/keylane/"
	if _, body, _ := get(t, http.MethodGet, base); !strings.Contains(body, `href="confirm?op=redrive&amp;seq=1"`) {
		t.Fatalf("the page does not link to the redrive of dead letter 1:\n%s", body)
	}
	form := confirmForm(t, base+"confirm?op=delete&seq=1")
	purge := confirmForm(t, base+"confirm?op=purge&through=1")
	if code, _, _ := get(t, http.MethodGet, base+"action"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET action: %d, want 405", code)
	}
	with := func(f url.Values, k, v string) url.Values {
		g := url.Values{}
		for kk, vv := range f {
			g[kk] = append([]string(nil), vv...)
		}
		if v == "" {
			g.Del(k)
		} else {
			g.Set(k, v)
		}
		return g
	}
	for name, c := range map[string]struct {
		form   url.Values
		origin string
		code   int
		says   string
	}{
		"no token":              {with(with(form, "token", ""), "confirm", "yes"), "", http.StatusForbidden, "token"},
		"another plan's token":  {with(with(form, "token", purge.Get("token")), "confirm", "yes"), "", http.StatusForbidden, "token"},
		"the box not ticked":    {form, "", http.StatusBadRequest, "not ticked"},
		"from another site":     {with(form, "confirm", "yes"), "http://evil.example", http.StatusForbidden, "origin"},
		"a sequence of nothing": {with(with(form, "seq", "x"), "confirm", "yes"), "", http.StatusBadRequest, "not a dead-letter sequence"},
	} {
		code, body := post(t, base+"action", c.origin, c.form)
		if code != c.code || !strings.Contains(body, c.says) || !strings.Contains(body, "nothing was done") && c.code == http.StatusForbidden {
			t.Errorf("%s: %d, want %d saying %q:\n%s", name, code, c.code, c.says, body)
		}
		if n := deadLetters(t, s.js); n != 1 {
			t.Fatalf("%s changed the dead letters: %d left", name, n)
		}
	}
	code, body := post(t, base+"action", hs.URL, with(form, "confirm", "yes"))
	if code != http.StatusOK || !strings.Contains(body, "dead letter 1: deleted") {
		t.Fatalf("the confirmed delete: %d\n%s", code, body)
	}
	if n := deadLetters(t, s.js); n != 0 {
		t.Fatalf("after the delete %d dead letters", n)
	}
}

// TestActionRefusedByPermissions: the console acts with its NATS user's
// rights; a user that may read the dead letters but not delete them is
// shown the confirmation, and then the server's refusal, with status
// 403, and nothing changes.
func TestActionRefusedByPermissions(t *testing.T) {
	srv := natstest.StartConfig(t, `accounts: {
  A: {
    jetstream: enabled
    users: [
      {user: admin, password: admin}
      {user: viewer, password: viewer, permissions: {publish: {allow: [">"], deny: ["$JS.API.STREAM.MSG.DELETE.>", "$JS.API.STREAM.PURGE.>"]}}}
    ]
  }
}
`)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin, err := jetstream.New(natstest.Connect(t, srv, nats.UserInfo("admin", "admin")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keylane.Setup(ctx, admin, keylane.TopologyConfig{Namespace: ns, Partitions: partitions}); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(partition.DeadSubject(ns, 0))
	m.Header.Set(keylane.HeaderKey, "sku:1")
	m.Header.Set(keylane.HeaderError, "declined")
	if _, err := admin.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	viewer, err := jetstream.New(natstest.Connect(t, srv, nats.UserInfo("viewer", "viewer")))
	if err != nil {
		t.Fatal(err)
	}
	hs := serve(t, viewer, statuspage.Config{Namespace: ns, Actions: true})
	base := hs.URL + "/keylane/"
	form := confirmForm(t, base+"confirm?op=delete&seq=1")
	form.Set("confirm", "yes")
	code, body := post(t, base+"action", "", form)
	if code != http.StatusForbidden || !strings.Contains(body, "the NATS server refused") || !strings.Contains(body, "Permissions Violation") {
		t.Fatalf("a delete the user may not do: %d, want 403 saying the server refused:\n%s", code, body)
	}
	if n := deadLetters(t, admin); n != 1 {
		t.Fatalf("the refused delete changed the dead letters: %d left", n)
	}
}
