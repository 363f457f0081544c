package statuspage

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultMaxAge      = time.Second
	DefaultRefresh     = 5 * time.Second
	DefaultDeadLetters = 20
	DefaultMaxLookups  = 2
)

// Config configures Handler. The zero value serves the default namespace.
type Config struct {
	// Namespace is the namespace to show. Defaults to "keylane".
	Namespace string
	// Worker is the ID of the worker serving the page, if one does: the
	// page names it and marks its partitions. Defaults to none.
	Worker string
	// Timeout bounds one reading of the namespace (the topology, leases,
	// consumers and dead letters together). Defaults to 5s.
	Timeout time.Duration
	// MaxAge is how long a reading is served again before NATS is asked
	// anew. Defaults to 1s.
	MaxAge time.Duration
	// Refresh is how often the HTML page reloads itself. Defaults to 5s;
	// a negative Refresh turns reloading off. A page with a look-up
	// (?job=, ?key=) never reloads: reload it by hand.
	Refresh time.Duration
	// DeadLetters is how many dead letters a page lists, newest first,
	// with a link to the older ones (the count is always the stream's).
	// Defaults to 20.
	DeadLetters int
	// MaxLookups is how many look-ups (?job=, ?key=) may read NATS at
	// once: each reads anew, a job's look-up scans the dead-letter
	// stream, and a reload-happy browser or a script must not turn the
	// page into that many scans. One beyond it is refused at once, in
	// its look-up's box, and reads nothing. Defaults to 2. A filtered
	// or older page of dead letters counts as a look-up.
	MaxLookups int
	// Actions turns on the actions on dead letters: redrive, delete and
	// purge, each behind a confirmation page and a POST that carries its
	// token (actions.go). Off, the page only reads, and confirm and
	// action are 404. keylane ui turns it on; a worker's page leaves it
	// off. The NATS user's permissions decide what an action may do.
	Actions bool
}

// Page is one reading of a namespace: what the HTML page shows and what
// status.json returns.
type Page struct {
	// Time is when it was read, by the serving process's clock.
	Time time.Time
	// Worker is Config.Worker.
	Worker string `json:",omitempty"`
	// Status is keylane.Inspect's report; nil if the reading failed.
	Status *keylane.Status `json:",omitempty"`
	// DeadLetters are the dead letters of this page, newest first, at
	// most Config.DeadLetters, with their Payload left out: the newest
	// ones, or those Dead.Query selected (?before=, ?dkey=, ?derr=,
	// ?older=, ?newer=).
	DeadLetters []keylane.DeadLetter `json:",omitempty"`
	// Dead says which page of dead letters DeadLetters is, and where
	// the next (older) one starts.
	Dead *DeadList `json:",omitempty"`
	// DeadError says why the dead letters asked for were not listed: a
	// bad filter, or a failed read.
	DeadError string `json:",omitempty"`
	// Workers are the live workers, from their member entries.
	Workers []Worker `json:",omitempty"`
	// Error says why the reading failed, or what part of it did.
	Error string `json:",omitempty"`
	// Lookup is the job or key the request asked for (?job=ID, ?key=KEY);
	// nil when it asked for none.
	Lookup *Lookup `json:",omitempty"`
}

// Lookup is a job's outcome or a key's state the page was asked for: with
// ?job=ID, keylane.InspectJob (the key's held outcomes too when ?key=KEY
// is also given); with ?key=KEY, keylane.InspectState. Each request reads
// anew: look-ups are not cached.
type Lookup struct {
	JobID string `json:",omitempty"`
	Key   string `json:",omitempty"`
	// Job is the job's outcome and where it was found; nil when not
	// found or not asked for.
	Job *keylane.FoundJob `json:",omitempty"`
	// JobNotFound says nothing is kept for JobID (keylane.ErrNoResult).
	JobNotFound bool `json:",omitempty"`
	// State is the key's state entry, Revision its revision; nil when the
	// key has none (StateNotFound) or was not asked for.
	State    *keylane.StateEntry `json:",omitempty"`
	Revision uint64              `json:",omitempty"`
	// StateNotFound says the key has no state entry (keylane.ErrNoState).
	StateNotFound bool `json:",omitempty"`
	// KeyView is where the key's jobs wait and run: its partition as
	// the namespace's reading shows it; nil when no key was asked for.
	KeyView *KeyView `json:",omitempty"`
	// Error says why a look-up failed: a bad job ID or key, or NATS.
	Error string `json:",omitempty"`
}

// KeyView is a key's jobs and its partition: the key's jobs stored and
// not yet delivered (Queued) and delivered but not yet acknowledged
// (Delivered: running, or waiting to be retried), counted from the jobs
// stream (keyJobs; lower bounds when Cut); and its partition's owner and
// counts of all keys: the jobs queued (Pending), in flight and
// redelivered there.
type KeyView struct {
	Queued, Delivered int
	Cut               bool `json:",omitempty"`
	Partition         int
	Owner             string `json:",omitempty"`
	Pending           uint64
	InFlight          int
	Redelivered       int
}

// Handler returns an http.Handler that serves the page of cfg.Namespace,
// read through js, at "/" and its JSON at "/status.json" (relative to
// where it is mounted: strip a prefix with http.StripPrefix); either
// takes ?job=ID and ?key=KEY to look a job or a key's state up (Lookup).
// Other paths
// are 404, methods other than GET and HEAD 405. A failed reading is
// served with status 503 and says what failed. It returns an error, and
// no handler, for a nil js or a negative setting. The handler is safe for
// concurrent use.
func Handler(js jetstream.JetStream, cfg Config) (http.Handler, error) {
	if js == nil {
		return nil, errors.New("statuspage: a JetStream context is required")
	}
	if cfg.Timeout < 0 || cfg.MaxAge < 0 || cfg.DeadLetters < 0 || cfg.MaxLookups < 0 {
		return nil, fmt.Errorf("statuspage: Timeout %s, MaxAge %s, DeadLetters %d and MaxLookups %d must not be negative", cfg.Timeout, cfg.MaxAge, cfg.DeadLetters, cfg.MaxLookups)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = keylane.DefaultNamespace
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.DeadLetters == 0 {
		cfg.DeadLetters = DefaultDeadLetters
	}
	if cfg.MaxLookups == 0 {
		cfg.MaxLookups = DefaultMaxLookups
	}
	h := &handler{js: js, cfg: cfg, sem: make(chan struct{}, 1), lookups: make(chan struct{}, cfg.MaxLookups)}
	_, _ = rand.Read(h.secret[:]) // crypto/rand.Read never fails (Go 1.24+)
	return h, nil
}

type handler struct {
	js  jetstream.JetStream
	cfg Config

	// sem lets one reading run at a time; last and lastAt (the monotonic
	// clock's reading of when it was taken) are only touched holding it.
	sem    chan struct{}
	last   Page
	lastAt time.Time
	// lookups holds a token per look-up reading NATS (MaxLookups).
	lookups chan struct{}
	// secret keys the actions' tokens (Config.Actions).
	secret [32]byte
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case h.cfg.Actions && r.URL.Path == "/action":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "statuspage: method "+r.Method+" not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.act(w, r)
		return
	case h.cfg.Actions && r.URL.Path == "/confirm":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "statuspage: method "+r.Method+" not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.confirm(w, r)
		return
	case r.URL.Path != "/" && r.URL.Path != "" && r.URL.Path != "/status.json":
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "statuspage: method "+r.Method+" not allowed", http.StatusMethodNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	p := h.read(ctx)
	q := r.URL.Query()
	if dq, err := parseDeadQuery(q); err != nil {
		p.DeadLetters, p.Dead, p.DeadError = nil, nil, err.Error()
	} else if !dq.zero() && p.Status != nil {
		// A filtered or older page is read for this request, as a
		// look-up is: it scans the dead-letter stream.
		p.DeadLetters, p.Dead, p.DeadError = nil, &DeadList{Query: dq}, ""
		select {
		case h.lookups <- struct{}{}:
			lctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
			l, dead, err := listDead(lctx, h.js, h.cfg.Namespace, dq, h.cfg.DeadLetters, time.Now())
			if err != nil {
				p.DeadError = h.failed("reading the dead letters of namespace "+h.cfg.Namespace, lctx, err)
			}
			cancel()
			<-h.lookups
			p.DeadLetters, p.Dead = dead, &l
		default:
			p.DeadError = fmt.Sprintf("statuspage: %d look-ups are running (Config.MaxLookups); try again in a moment", h.cfg.MaxLookups)
		}
	}
	if q.Has("job") || q.Has("key") {
		select {
		case h.lookups <- struct{}{}:
			lctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
			p.Lookup = h.lookup(lctx, q.Get("job"), q.Get("key"), q.Has("job"))
			if k := q.Get("key"); k != "" && p.Status != nil && partition.ValidateKey(k) == nil {
				ps := p.Status.Partition[partition.Of(k, p.Status.Partitions)]
				kv := &KeyView{Partition: ps.Partition, Owner: ps.Owner, Pending: ps.Pending, InFlight: ps.InFlight, Redelivered: ps.Redelivered}
				if err := keyJobs(lctx, h.js, h.cfg.Namespace, k, p.Status, kv); err != nil {
					p.Lookup.Error = strings.TrimPrefix(p.Lookup.Error+"\n", "\n") + h.failed("counting the jobs of key "+strconv.Quote(k), lctx, err)
				}
				p.Lookup.KeyView = kv
			}
			cancel()
			<-h.lookups
		default:
			p.Lookup = &Lookup{JobID: q.Get("job"), Key: q.Get("key"),
				Error: fmt.Sprintf("statuspage: %d look-ups are running (Config.MaxLookups); try again in a moment", h.cfg.MaxLookups)}
		}
	}
	code := http.StatusOK
	if p.Status == nil {
		code = http.StatusServiceUnavailable
	}
	var body bytes.Buffer
	var err error
	if r.URL.Path == "/status.json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(&body)
		enc.SetIndent("", "  ")
		err = enc.Encode(p)
	} else {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		err = pageTemplate.Execute(&body, h.view(p))
	}
	if err != nil {
		http.Error(w, "statuspage: rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body.Bytes())
}

// read returns a reading at most MaxAge old, taking a new one if needed.
// It returns by ctx's deadline whatever NATS does.
func (h *handler) read(ctx context.Context) Page {
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return Page{Time: time.Now(), Worker: h.cfg.Worker, Error: fmt.Sprintf("statuspage: an earlier reading of namespace %s is still waiting for NATS (%v)", h.cfg.Namespace, ctx.Err())}
	}
	defer func() { <-h.sem }()
	if !h.lastAt.IsZero() && time.Since(h.lastAt) < h.cfg.MaxAge {
		return h.last
	}
	p := h.take(ctx)
	if r := context.Cause(ctx); r != nil && !errors.Is(r, context.DeadlineExceeded) {
		// This viewer went away mid-reading: its failure is not the
		// namespace's, so it is not cached for the other viewers.
		return p
	}
	h.last, h.lastAt = p, time.Now()
	return h.last
}

// take reads the namespace once.
func (h *handler) take(ctx context.Context) Page {
	p := Page{Time: time.Now(), Worker: h.cfg.Worker}
	if nc := h.js.Conn(); nc != nil && !nc.IsConnected() {
		p.Error = fmt.Sprintf("statuspage: not connected to NATS (connection %s", nc.Status())
		if err := nc.LastError(); err != nil {
			p.Error += ", last error: " + err.Error()
		}
		p.Error += ")"
		return p
	}
	st, err := keylane.Inspect(ctx, h.js, h.cfg.Namespace)
	if err != nil {
		p.Error = h.failed("reading namespace "+h.cfg.Namespace, ctx, err)
		return p
	}
	p.Status = &st
	if p.Workers, err = readWorkers(ctx, h.js, h.cfg.Namespace, &st); err != nil {
		p.Error = h.failed("reading the members of namespace "+h.cfg.Namespace, ctx, err)
	}
	if st.DeadLetters == 0 {
		return p
	}
	l, dead, err := listDead(ctx, h.js, h.cfg.Namespace, DeadQuery{}, h.cfg.DeadLetters, p.Time)
	if err != nil {
		p.Error = h.failed("reading the dead letters of namespace "+h.cfg.Namespace, ctx, err)
		return p
	}
	p.DeadLetters, p.Dead = dead, &l
	return p
}

// lookup reads a job's outcome (when asked for one) and a key's state
// (when asked for a key): the same look-ups as keylane job and keylane
// state get.
func (h *handler) lookup(ctx context.Context, id, key string, job bool) *Lookup {
	l := &Lookup{JobID: id, Key: key}
	var errs []string
	if key != "" || !job {
		e, rev, err := keylane.InspectState(ctx, h.js, h.cfg.Namespace, key)
		switch {
		case err == nil:
			l.State, l.Revision = &e, rev
		case errors.Is(err, keylane.ErrNoState):
			l.StateNotFound = true
		default:
			errs = append(errs, h.failed("reading the state of key "+strconv.Quote(key), ctx, err))
		}
	}
	if job {
		f, err := keylane.InspectJob(ctx, h.js, h.cfg.Namespace, id, key)
		switch {
		case err == nil:
			l.Job = &f
		case errors.Is(err, keylane.ErrNoResult):
			l.JobNotFound = true
		default:
			errs = append(errs, h.failed("looking up job "+strconv.Quote(id), ctx, err))
		}
	}
	l.Error = strings.Join(errs, "\n")
	return l
}

// failed says what failed; a request cut by the reading's deadline says
// so, with the deadline, whatever error nats.go made of it. The server
// refuses a request the user may not publish asynchronously, so the
// request only times out: the connection's last error then says why.
func (h *handler) failed(what string, ctx context.Context, err error) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		msg := fmt.Sprintf("statuspage: %s: NATS gave no answer within %s: %v", what, h.cfg.Timeout, err)
		if nc := h.js.Conn(); nc != nil && nc.LastError() != nil {
			msg += "; the connection's last error: " + nc.LastError().Error()
		}
		return msg
	}
	return fmt.Sprintf("statuspage: %s: %v", what, err)
}

// view is what the template renders: the reading and a few sums of it.
type view struct {
	Page
	Namespace string
	Refresh   int // seconds; 0: off
	Backlog   uint64
	InFlight  int
	Free      int
	// Actions is Config.Actions.
	Actions bool
	// Query is the dead letters' query (filters and page); Listing says
	// it is not the default (newest, unfiltered).
	Query   DeadQuery
	Listing bool
	// NewestURL leads to the newest page with the same filters (on an
	// older page); OlderURL to the next older page; RedriveURL,
	// DeleteURL and PurgeURL to the confirmations of the actions on the
	// letters listed, or (purge) on all the stream holds now.
	NewestURL, OlderURL, RedriveURL, DeleteURL, PurgeURL string
}

func (h *handler) view(p Page) view {
	v := view{Page: p, Namespace: h.cfg.Namespace, Actions: h.cfg.Actions}
	// A look-up's page, or a page of filtered or older dead letters,
	// does not reload: each reads anew (the dead-letter stream through,
	// for a job), and a tab left open on one would repeat it every
	// Refresh.
	if p.Dead != nil {
		v.Query = p.Dead.Query
	}
	v.Listing = !v.Query.zero()
	if h.cfg.Refresh > 0 && p.Lookup == nil && v.Query.zero() && p.DeadError == "" {
		v.Refresh = int(math.Ceil(h.cfg.Refresh.Seconds()))
	}
	if p.Status != nil {
		for _, ps := range p.Status.Partition {
			v.Backlog += ps.Pending
			v.InFlight += ps.InFlight
			if ps.Owner == "" {
				v.Free++
			}
		}
	}
	if p.Dead != nil {
		if v.Query.Before != 0 {
			q := v.Query
			q.Before = 0
			v.NewestURL = "?" + q.values().Encode()
		}
		if p.Dead.Older != 0 {
			q := v.Query
			q.Before = p.Dead.Older
			v.OlderURL = "?" + q.values().Encode()
		}
		if h.cfg.Actions && len(p.DeadLetters) > 0 {
			redrive, del := plan{Op: opRedrive}, plan{Op: opDelete}
			for _, d := range p.DeadLetters {
				redrive.Seqs = append(redrive.Seqs, d.Seq)
				del.Seqs = append(del.Seqs, d.Seq)
			}
			v.RedriveURL = "confirm?" + redrive.values().Encode()
			v.DeleteURL = "confirm?" + del.values().Encode()
			v.PurgeURL = "confirm?" + plan{Op: opPurge, Through: p.Dead.Last}.values().Encode()
		}
	}
	return v
}

// cutKeys is how many characters of a key or job ID the page's tables
// show; the whole is in the cell's title.
const cutKeys = 32

//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	// age is how long before now t was, rounded for reading; "-" for a
	// zero t.
	"age": func(now, t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := now.Sub(t)
		switch {
		case d < time.Second:
			return d.Round(time.Millisecond).String()
		case d < time.Hour:
			return d.Round(time.Second).String()
		default:
			return d.Round(time.Minute).String()
		}
	},
	"hex": func(n uint64) string { return fmt.Sprintf("%x", n) },
	// cut shortens s to at most cutKeys characters, an ellipsis last:
	// the page shows it, with the whole of s in a title attribute.
	"cut": func(s string) string {
		if utf8.RuneCountInString(s) <= cutKeys {
			return s
		}
		r := []rune(s)
		return string(r[:cutKeys-1]) + "…"
	},
	// text shows a value or result: as text when it is UTF-8, else its
	// length and hex; "(none)" for nil.
	"text": func(b []byte) string {
		switch {
		case b == nil:
			return "(none)"
		case utf8.Valid(b):
			return strconv.Quote(string(b))
		}
		return fmt.Sprintf("%d bytes: %x", len(b), b)
	},
	"plus1": func(n int) int { return n + 1 },
	// confirmURL is the confirmation page of op on one dead letter.
	"confirmURL": func(op string, seq uint64) string {
		return "confirm?" + plan{Op: op, Seqs: []uint64{seq}}.values().Encode()
	},
	"durs": func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	},
}).Parse(pageHTML))
