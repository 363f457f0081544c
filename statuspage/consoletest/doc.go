// Package consoletest holds the browser tests of the status page and of
// the console (keylane ui): a real headless Chromium driven through its
// DevTools protocol (chromedp) clicks, fills forms and measures the
// page. It is its own module, so that the library's go.mod has no
// chromedp: scripts/test runs it.
package consoletest
