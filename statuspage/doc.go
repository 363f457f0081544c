// Package statuspage serves a small status page of a keylane namespace:
// each partition's owner, fence, tenure and backlog, the live workers
// (ID, host, version, start, last heartbeat and partitions, from their
// member entries), and the dead letters, newest first,
// a page (Config.DeadLetters, 20) at a time with a link to the older ones,
// filtered by key, error and age (?dkey=, ?derr=, ?older=, ?newer=;
// DeadQuery). It is plain server-rendered HTML that refreshes itself (no
// script, no external assets), tables that become cards on a narrow
// screen (a 390px phone does not scroll sideways), and the same reading
// as JSON at status.json.
//
// The worker command serves it, read-only, on its --metrics address, next
// to /metrics: it dies with the worker. `keylane ui` serves it from any
// machine that reaches NATS, with the operator's credentials and
// Config.Actions on: redrive, delete and purge of dead letters, each
// behind a confirmation page whose form carries a token of that very
// action (an HMAC under a key drawn at start) and a box to tick; a POST
// without them, or from another origin, changes nothing, and what the
// NATS user may not do is shown as the server's refusal (actions.go).
// A program that runs its own HTTP server mounts it anywhere:
//
//	page, err := statuspage.Handler(js, statuspage.Config{Namespace: "shop"})
//	if err != nil { ... }
//	mux.Handle("/keylane/", http.StripPrefix("/keylane", page))
//
// It reads with keylane.Inspect and keylane.DeadLetters, so it shows what
// `keylane status` and `keylane dead list` show. Each reading is bounded
// by Config.Timeout: a NATS that does not answer, or a connection that is
// down, gives a page (HTTP 503) that says what failed, never a hang. One
// reading runs at a time, and a reading younger than Config.MaxAge is
// served again, so many open browser tabs cost NATS no more than one.
//
// A form on the page looks a job up by ID and a key's state up
// (?job=ID, ?key=KEY, both at once; status.json takes the same query and
// returns Page.Lookup), with keylane.InspectJob and keylane.InspectState:
// what `keylane job ID --key KEY` and `keylane state get KEY` print. A
// look-up is read for each request, never cached, bounded by its own
// Config.Timeout; at most Config.MaxLookups (2) read NATS at once, and
// one beyond them is refused at once in its box, reading nothing (a job's
// look-up scans the dead-letter stream: many at once were as many scans,
// TestLookupsAreCapped); its page does not reload itself (a tab left open
// on a job would read the dead-letter stream through every Refresh:
// TestLookupPageDoesNotReload); a key's look-up also counts the key's
// jobs queued and delivered-not-acknowledged in the jobs stream (a bounded
// scan of its partition's messages: KeyView); a filtered or older page of
// dead letters is read per request too, as a look-up, scanning at most
// 1000 dead letters (the next page goes on where it stopped); a bad job ID or key, or a failed read, is an error in
// the look-up's box, and the namespace's reading is shown as ever. With
// dead letters, their table comes above the partitions; keys and job IDs
// longer than 32 characters are cut, the whole in the cell's title.
//
// The page shows job keys, job IDs, results, state values and handler errors, but never a
// payload (`keylane dead show SEQ` does). Serve it where only operators
// reach it: the worker's --metrics address should be a loopback or private
// address; keylane ui binds 127.0.0.1 unless --listen says otherwise and
// refuses requests naming another host (DNS rebinding).
//
// Its browser tests (a real headless chromium driven through chromedp:
// paging, filters, a confirmed redrive, a phone's width, the console
// outliving every worker) are in statuspage/consoletest, a module of its
// own.
package statuspage
