package statuspage_test

import (
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/statuspage"
)

// TestHostileLookups: look-up values built to break out of the page
// (markup and script in ?job= and ?key=, in the form's value attributes,
// the error and the not-found text) come back escaped, never as markup;
// a key far over the limit is refused, not echoed into a state read; and
// many look-ups at once that each read the dead-letter stream leave no
// consumer on it and no goroutine behind once answered.
func TestHostileLookups(t *testing.T) {
	s := newScene(t)
	// As many look-ups may run at once as the test makes (the default
	// MaxLookups would refuse most: TestLookupsAreCapped).
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID, Refresh: -1, MaxLookups: 24})
	base := hs.URL + "/keylane/"
	const evil = `"><script>alert(1)</script><img src=x onerror=alert(2)>`
	for _, q := range []url.Values{
		{"job": {evil}},
		{"key": {evil}},
		{"job": {"never-1"}, "key": {evil}},
		{"job": {strings.Repeat("a", 300)}, "key": {strings.Repeat("<b>", 2000)}},
	} {
		code, body, _ := get(t, http.MethodGet, base+"?"+q.Encode())
		if code != http.StatusOK {
			t.Fatalf("?%s: status %d", q.Encode(), code)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<b><b>"} {
			if strings.Contains(body, bad) {
				t.Fatalf("?%.80s: the page carries %q unescaped:\n%s", q.Encode(), bad, body)
			}
		}
		_, js, _ := get(t, http.MethodGet, base+"status.json?"+q.Encode())
		if strings.Contains(js, "<script") {
			t.Fatalf("status.json?%.80s carries <script unescaped", q.Encode())
		}
	}

	before := runtime.NumGoroutine()
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := url.Values{"job": {fmt.Sprintf("never-%d", i)}}
			code, body, _ := get(t, http.MethodGet, base+"status.json?"+q.Encode())
			if code != http.StatusOK || !strings.Contains(body, `"JobNotFound": true`) {
				errs <- fmt.Sprintf("look-up %d: %d %s", i, code, body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	dead := keylane.Names{Namespace: ns}.Dead()
	testwait.Eventually(t, 20*time.Second, "no consumer left on the dead-letter stream", func() bool {
		st, err := s.js.Stream(t.Context(), dead)
		return err == nil && st.CachedInfo().State.Consumers == 0
	})
	http.DefaultClient.CloseIdleConnections()
	testwait.Eventually(t, 20*time.Second, fmt.Sprintf("goroutines back to about %d", before), func() bool {
		return runtime.NumGoroutine() <= before+2
	})
}

// TestLookupPageDoesNotReload: the page reloads itself, but not with a
// look-up: each look-up reads anew, the dead-letter stream through, so a
// tab left open on ?job= would scan the stream every Refresh for as long
// as it stays open. Before, the look-up page reloaded every 5s as the
// plain page does.
func TestLookupPageDoesNotReload(t *testing.T) {
	s := newScene(t)
	hs := serve(t, s.js, statuspage.Config{Namespace: ns, Worker: workerID})
	base := hs.URL + "/keylane/"
	const reload = `http-equiv="refresh"`
	if _, body, _ := get(t, http.MethodGet, base); !strings.Contains(body, reload) {
		t.Fatalf("the plain page does not reload itself:\n%s", body)
	}
	for _, q := range []url.Values{{"job": {"never-1"}}, {"key": {"sku:none"}}, {"job": {"never-1"}, "key": {"sku:none"}}} {
		if _, body, _ := get(t, http.MethodGet, base+"?"+q.Encode()); strings.Contains(body, reload) || strings.Contains(body, "reloads every") {
			t.Fatalf("the page of look-up ?%s reloads itself, repeating the look-up:\n%s", q.Encode(), body)
		}
	}
}
