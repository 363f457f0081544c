package statuspage_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/statuspage"
)

// TestLookupsAreCapped: look-ups each read NATS anew (a dead-letter scan
// among them), so many at once are many reads; beyond
// Config.MaxLookups running, a look-up is refused at once, saying so,
// and sends nothing. Here NATS never answers, so the look-ups that run
// hold their slots for the whole Timeout: of 10 at once, MaxLookups (2)
// wait it out and 8 are refused. Before, all 10 went to NATS.
func TestLookupsAreCapped(t *testing.T) {
	const timeout = 3 * time.Second
	hs := serve(t, silentJS(t), statuspage.Config{Namespace: ns, Timeout: timeout, MaxLookups: 2})
	const n = 10
	errs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := http.Get(fmt.Sprintf("%s/keylane/status.json?job=job-%d", hs.URL, i))
			if err != nil {
				errs[i] = "request: " + err.Error()
				return
			}
			defer resp.Body.Close()
			var p statuspage.Page
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Lookup == nil {
				errs[i] = fmt.Sprintf("no look-up in the answer (%v)", err)
				return
			}
			errs[i] = p.Lookup.Error
		})
	}
	wg.Wait()
	waited, refused := 0, 0
	for _, e := range errs {
		switch {
		case strings.Contains(e, "NATS gave no answer within "+timeout.String()):
			waited++
		case strings.Contains(e, "2 look-ups are running (Config.MaxLookups); try again in a moment"):
			refused++
		default:
			t.Errorf("unexpected look-up error: %q", e)
		}
	}
	if waited != 2 || refused != n-2 {
		t.Errorf("%d look-ups waited for NATS and %d were refused; want 2 and %d", waited, refused, n-2)
	}
}
