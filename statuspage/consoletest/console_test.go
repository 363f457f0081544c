package consoletest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
)

// phone is the viewport of a phone held upright (an iPhone 12 to 15).
const phoneWidth, phoneHeight = 390, 844

// TestWorkerPage: a worker's status page, in a real browser, lists the
// newest dead letters first, a page at a time with a link to the older
// ones (on main it listed the 20 oldest with no way to the rest).
func TestWorkerPage(t *testing.T) {
	s := newScene(t)
	b := browser(t, 1200, 900)
	run(t, b, "opening the worker's page", chromedp.Navigate(s.pages[0]), chromedp.WaitVisible(chromedp.CSS(`#dead`)))
	if got, want := deadRows(t, b), seqRows(bad+1-19, bad+1); !slices.Equal(got, want) {
		t.Fatalf("first page: rows %v, want the 20 newest, newest first: %v", got, want)
	}
	run(t, b, "following the link to older dead letters", chromedp.Click(chromedp.CSS(`#older`)), chromedp.WaitVisible(chromedp.CSS(`#dead6`)))
	if got, want := deadRows(t, b), seqRows(1, bad+1-20); !slices.Equal(got, want) {
		t.Fatalf("second page: rows %v, want %v", got, want)
	}
}

// TestWorkerPageOnAPhone: at a phone's width (390px) the worker's page
// does not scroll sideways; the dead letters' key and error are on
// screen (on main it was 837px wide).
func TestWorkerPageOnAPhone(t *testing.T) {
	s := newScene(t)
	fits(t, browser(t, phoneWidth, phoneHeight), s.pages[0], "worker-page-phone.png")
}

// fits opens url at a phone's width and wants the page no wider than
// the screen, with the dead letters' key and error on it.
func fits(t *testing.T, phone context.Context, url, shot string) {
	t.Helper()
	run(t, phone, "opening the page at a phone's width", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#dead`)))
	width := value(t, phone, "measuring the page", chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	inner := value(t, phone, "measuring the window", chromedp.Evaluate[int](`window.innerWidth`))
	path := screenshot(t, phone, shot)
	// And the dead letters, scrolled to, as a phone shows them.
	value(t, phone, "scrolling to the dead letters", chromedp.Evaluate[bool](`document.getElementById('dead').scrollIntoView(), true`))
	screenshot(t, phone, strings.TrimSuffix(shot, ".png")+"-dead.png")
	t.Logf("%s at %dpx: scrollWidth %d; screenshot %s", url, inner, width, path)
	if inner != phoneWidth {
		t.Fatalf("the viewport is %dpx wide, want %d", inner, phoneWidth)
	}
	if width > phoneWidth {
		t.Fatalf("at %dpx the page is %dpx wide: it scrolls sideways", phoneWidth, width)
	}
	for _, cell := range []string{"td.key", "td.dead-error", "td.pending"} {
		right := value(t, phone, "placing "+cell, chromedp.Evaluate[float64](`document.querySelector('tbody tr `+cell+`').getBoundingClientRect().right`))
		if right > phoneWidth {
			t.Errorf("at %dpx the first %s ends at %.0fpx: off screen", phoneWidth, cell, right)
		}
	}
}

// TestConsole: keylane ui, a process of its own on the namespace's NATS,
// serves the console in a real browser: newest dead letters first with
// paging, filters, a redrive through its confirmation that really runs
// the job again, and a phone's width; it keeps serving after every
// worker is SIGKILLed.
func TestConsole(t *testing.T) {
	s := newScene(t)
	base, _ := s.ui(t)
	b := browser(t, 1200, 900)

	run(t, b, "opening the console", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#dead`)))
	if got, want := deadRows(t, b), seqRows(bad+1-19, bad+1); !slices.Equal(got, want) {
		t.Fatalf("first page: rows %v, want the 20 newest, newest first: %v", got, want)
	}
	screenshot(t, b, "console.png")
	run(t, b, "following the link to older dead letters", chromedp.Click(chromedp.CSS(`#older`)), chromedp.WaitVisible(chromedp.CSS(`#dead6`)))
	if got, want := deadRows(t, b), seqRows(1, bad+1-20); !slices.Equal(got, want) {
		t.Fatalf("second page: rows %v, want %v", got, want)
	}

	// Filters: by key, by a piece of the error, by age.
	run(t, b, "filtering by key", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#dead-filter`)),
		chromedp.SendKeys(chromedp.CSS(`#dead-filter input[name=dkey]`), "sku:1"),
		chromedp.Submit(chromedp.CSS(`#dead-filter`)))
	// The unfiltered page has a #dead-shown too: wait for the filtered one.
	testwait.Eventually(t, 30*time.Second, "the browser shows the filtered page", func() bool {
		loc, err := chromedp.Run(b, chromedp.Location())
		return err == nil && strings.Contains(loc, "dkey=sku%3A1")
	})
	run(t, b, "waiting for the filtered page", chromedp.WaitVisible(chromedp.CSS(`#dead-shown`)))
	// sku:1 and sku:10..19 contain "sku:1".
	want := []string{"dead19", "dead18", "dead17", "dead16", "dead15", "dead14", "dead13", "dead12", "dead11", "dead10", "dead1"}
	if got := deadRows(t, b); !slices.Equal(got, want) {
		t.Fatalf("key filter sku:1: rows %v, want %v", got, want)
	}
	q := url.Values{"derr": {"overflow"}}
	run(t, b, "filtering by error", chromedp.Navigate(base+"?"+q.Encode()), chromedp.WaitVisible(chromedp.CSS(`#dead-shown`)))
	if got := deadRows(t, b); !slices.Equal(got, []string{fmt.Sprintf("dead%d", bad+1)}) {
		t.Fatalf("error filter %q: rows %v, want only the restock's", "overflow", got)
	}
	q = url.Values{"older": {"1h"}}
	run(t, b, "filtering by age", chromedp.Navigate(base+"?"+q.Encode()), chromedp.WaitVisible(chromedp.CSS(`#dead-shown`)))
	if got := deadRows(t, b); len(got) != 0 {
		t.Fatalf("older than 1h: rows %v, want none", got)
	}
	q = url.Values{"older": {"soon"}}
	run(t, b, "a bad age", chromedp.Navigate(base+"?"+q.Encode()))
	msg := value(t, b, "reading the filter's error", chromedp.Text(chromedp.CSS(`#dead-filter-error`)))
	if !strings.Contains(msg, "soon") {
		t.Fatalf("a bad age says %q", msg)
	}

	// A redrive: the row's button, the confirmation, the job runs.
	run(t, b, "redriving through the confirmation", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#dead26`)),
		chromedp.Click(chromedp.CSS(`#dead26 .redrive`)), chromedp.WaitVisible(chromedp.CSS(`#confirm-form`)))
	screenshot(t, b, "console-confirm.png")
	plan := value(t, b, "reading the confirmation", chromedp.Text(chromedp.CSS(`#confirm-plan`)))
	if !strings.Contains(plan, redriveID) || !strings.Contains(plan, redriveKey) {
		t.Fatalf("the confirmation does not name the job and key: %q", plan)
	}
	if n := deadCount(t, s); n != bad+1 {
		t.Fatalf("showing the confirmation changed the dead letters: %d", n)
	}
	run(t, b, "confirming", chromedp.Click(chromedp.CSS(`#confirm-check`)), chromedp.Click(chromedp.CSS(`#confirm-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`#action-result`)))
	result := value(t, b, "reading the result", chromedp.Text(chromedp.CSS(`#action-result`)))
	if !strings.Contains(result, "redriven") {
		t.Fatalf("the redrive says %q", result)
	}
	testwait.Eventually(t, 30*time.Second, "the redriven restock ran: the stock is 5", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := s.client.Call(ctx, redriveKey, []byte("get"))
		return err == nil && string(res) == "stock 5"
	})
	if n := deadCount(t, s); n != bad {
		t.Fatalf("after the redrive %d dead letters, want %d", n, bad)
	}

	// The key's view: nothing queued or running, its last outcome the
	// redriven restock's.
	run(t, b, "looking the key up", chromedp.Navigate(base),
		chromedp.SendKeys(chromedp.CSS(`#lookup-form input[name=key]`), redriveKey),
		chromedp.Submit(chromedp.CSS(`#lookup-form`)), chromedp.WaitVisible(chromedp.CSS(`#lookup-key`)))
	keyText := value(t, b, "reading the key's view", chromedp.Text(chromedp.CSS(`#lookup`)))
	for _, want := range []string{"queued 0", "running or retrying 0", `"ok 5"`} {
		if !strings.Contains(keyText, want) {
			t.Errorf("the key's view does not say %q:\n%s", want, keyText)
		}
	}

	phone := browser(t, phoneWidth, phoneHeight)
	fits(t, phone, base, "console-phone.png")

	// Every worker SIGKILLed: the console still serves; its page says no
	// worker is live once their leases expire.
	for _, w := range s.workers {
		w.Kill(t)
	}
	testwait.Eventually(t, 30*time.Second, "the console shows no live worker and free partitions", func() bool {
		code, body, err := httpGet(t.Context(), base)
		return err == nil && code == http.StatusOK && strings.Contains(body, `id="members">No live worker`) &&
			strings.Contains(body, fmt.Sprintf(`<strong id="free">%d</strong>`, partitions))
	})
	if _, _, err := httpGet(t.Context(), s.pages[0]); err == nil {
		t.Fatalf("the killed worker's page still answers")
	}
	run(t, b, "the console after the workers died", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`#dead25`)))
	if got := deadRows(t, b); len(got) != 20 || got[0] != "dead25" {
		t.Fatalf("after the workers died: rows %v", got)
	}

	// With no worker left, a purge through its confirmation.
	run(t, b, "purging through the confirmation", chromedp.Click(chromedp.CSS(`#purge-all`)), chromedp.WaitVisible(chromedp.CSS(`#confirm-form`)),
		chromedp.Click(chromedp.CSS(`#confirm-check`)), chromedp.Click(chromedp.CSS(`#confirm-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`#action-result`)))
	if result := value(t, b, "reading the result", chromedp.Text(chromedp.CSS(`#action-result`))); !strings.Contains(result, "purged") {
		t.Fatalf("the purge says %q", result)
	}
	if n := deadCount(t, s); n != 0 {
		t.Fatalf("after the purge %d dead letters", n)
	}
}

func deadCount(t *testing.T, s *scene) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := keylane.Inspect(ctx, s.js, ns)
	if err != nil {
		t.Fatal(err)
	}
	return st.DeadLetters
}
