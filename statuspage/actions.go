package statuspage

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The actions on dead letters (Config.Actions). Each takes two steps: a
// GET of confirm?op=...&seq=... shows what it will do, reading the dead
// letters, and changes nothing; its form POSTs to action with a token
// that binds that very plan (an HMAC of it under a key this handler drew
// at random) and a confirmation box that must be ticked. A POST without
// the token of its plan, without the box, or sent from another site
// (Origin or Sec-Fetch-Site) is refused and changes nothing. What the
// NATS connection's user may do decides the rest: a refusal by the server
// is shown as such, with status 403.
const (
	opRedrive = "redrive" // submit again: keylane.Client.Redrive
	opDelete  = "delete"  // delete these: keylane.DeleteDeadLetter
	opPurge   = "purge"   // delete all through a sequence: keylane.PurgeDeadLettersThrough
	// maxPlan bounds the sequences one action names.
	maxPlan = 100
	// actionTimeout bounds one action.
	actionTimeout = time.Minute
)

// plan is an action on dead letters.
type plan struct {
	Op      string
	Seqs    []uint64
	Through uint64
}

func parsePlan(v url.Values) (plan, error) {
	p := plan{Op: v.Get("op")}
	switch p.Op {
	case opRedrive, opDelete:
		if len(v["seq"]) == 0 || len(v["seq"]) > maxPlan {
			return plan{}, fmt.Errorf("statuspage: %s names 1 to %d dead letters (seq=), not %d", p.Op, maxPlan, len(v["seq"]))
		}
		for _, s := range v["seq"] {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil || n == 0 {
				return plan{}, fmt.Errorf("statuspage: seq=%q is not a dead-letter sequence", s)
			}
			p.Seqs = append(p.Seqs, n)
		}
	case opPurge:
		n, err := strconv.ParseUint(v.Get("through"), 10, 64)
		if err != nil || n == 0 {
			return plan{}, fmt.Errorf("statuspage: purge needs through=SEQ, the last dead letter to delete, not %q", v.Get("through"))
		}
		p.Through = n
	default:
		return plan{}, fmt.Errorf("statuspage: op=%q is not an action: redrive, delete or purge", p.Op)
	}
	return p, nil
}

func (p plan) values() url.Values {
	v := url.Values{"op": {p.Op}}
	for _, s := range p.Seqs {
		v.Add("seq", strconv.FormatUint(s, 10))
	}
	if p.Through != 0 {
		v.Set("through", strconv.FormatUint(p.Through, 10))
	}
	return v
}

// Form is the plan as the confirmation form's hidden fields.
func (p plan) Form() url.Values { return p.values() }

// token is the plan's CSRF token: only a confirmation page this handler
// served holds it.
func (h *handler) token(p plan) string {
	m := hmac.New(sha256.New, h.secret[:])
	m.Write([]byte(p.values().Encode()))
	return hex.EncodeToString(m.Sum(nil))
}

// confirmView is what the confirmation and result pages render.
type confirmView struct {
	Namespace string
	Plan      plan
	Query     string // the plan as a query, for the form
	Token     string
	Letters   []keylane.DeadLetter
	Missing   []uint64 // sequences that hold no dead letter
	Count     uint64   // purge: dead letters the stream holds
	First     uint64
	Error     string
	Results   []actionResult
	Refused   bool
}

type actionResult struct {
	Seq  uint64
	OK   bool
	Text string
}

// confirm serves the confirmation page of an action: what it will do,
// read from the stream, and the form that does it.
func (h *handler) confirm(w http.ResponseWriter, r *http.Request) {
	p, err := parsePlan(r.URL.Query())
	if err != nil {
		h.render(w, http.StatusBadRequest, "confirm", confirmView{Namespace: h.cfg.Namespace, Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	v := confirmView{Namespace: h.cfg.Namespace, Plan: p, Query: p.values().Encode(), Token: h.token(p)}
	code := http.StatusOK
	switch p.Op {
	case opPurge:
		n, first, _, err := keylane.DeadLetterSpan(ctx, h.js, h.cfg.Namespace)
		if err != nil {
			v.Error, code = h.failed("reading the dead-letter stream", ctx, err), http.StatusServiceUnavailable
		}
		v.Count, v.First = n, first
	default:
		for _, seq := range p.Seqs {
			d, err := keylane.DeadLetterAt(ctx, h.js, h.cfg.Namespace, seq)
			switch {
			case err == nil:
				d.Payload = nil
				v.Letters = append(v.Letters, d)
			case errors.Is(err, keylane.ErrNoTopology):
				v.Error, code = h.failed("reading dead letter "+strconv.FormatUint(seq, 10), ctx, err), http.StatusNotFound
			case errors.Is(err, jetstream.ErrMsgNotFound):
				v.Missing = append(v.Missing, seq)
			default:
				v.Error, code = h.failed("reading dead letter "+strconv.FormatUint(seq, 10), ctx, err), http.StatusServiceUnavailable
			}
		}
		if v.Error == "" && len(v.Letters) == 0 {
			v.Error, code = fmt.Sprintf("statuspage: no dead letter at %v: redriven or deleted already", v.Missing), http.StatusNotFound
		}
	}
	if v.Error != "" {
		v.Token = "" // nothing to confirm
	}
	h.render(w, code, "confirm", v)
}

// act does a confirmed action.
func (h *handler) act(w http.ResponseWriter, r *http.Request) {
	v := confirmView{Namespace: h.cfg.Namespace}
	if err := sameOrigin(r); err != nil {
		v.Error = err.Error()
		h.render(w, http.StatusForbidden, "result", v)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		v.Error = "statuspage: reading the form: " + err.Error()
		h.render(w, http.StatusBadRequest, "result", v)
		return
	}
	p, err := parsePlan(r.PostForm)
	if err != nil {
		v.Error = err.Error()
		h.render(w, http.StatusBadRequest, "result", v)
		return
	}
	v.Plan = p
	if t := r.PostForm.Get("token"); !hmac.Equal([]byte(t), []byte(h.token(p))) {
		v.Error = "statuspage: this form's token is not the one its confirmation page gave (a form from elsewhere, or from before this console restarted): open the confirmation again; nothing was done"
		h.render(w, http.StatusForbidden, "result", v)
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		v.Error = "statuspage: the confirmation box was not ticked; nothing was done"
		h.render(w, http.StatusBadRequest, "result", v)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	nc := h.js.Conn()
	refused := func(err error) error {
		err = natsflags.Refused(nc, err)
		if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permission") {
			v.Refused = true
		}
		return err
	}
	switch p.Op {
	case opPurge:
		err := keylane.PurgeDeadLettersThrough(ctx, h.js, h.cfg.Namespace, p.Through)
		if err != nil {
			v.Error = "statuspage: purge: " + refused(err).Error()
		} else {
			v.Results = append(v.Results, actionResult{Seq: p.Through, OK: true, Text: fmt.Sprintf("purged: every dead letter through sequence %d deleted", p.Through)})
		}
	case opDelete:
		for _, seq := range p.Seqs {
			if err := keylane.DeleteDeadLetter(ctx, h.js, h.cfg.Namespace, seq); err != nil {
				v.Results = append(v.Results, actionResult{Seq: seq, Text: refused(err).Error()})
			} else {
				v.Results = append(v.Results, actionResult{Seq: seq, OK: true, Text: "deleted"})
			}
		}
	case opRedrive:
		c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: h.cfg.Namespace})
		if err != nil {
			v.Error = "statuspage: redrive: " + refused(err).Error()
			break
		}
		defer c.Close()
		for _, seq := range p.Seqs {
			d, err := keylane.DeadLetterAt(ctx, h.js, h.cfg.Namespace, seq)
			if err != nil {
				v.Results = append(v.Results, actionResult{Seq: seq, Text: "reading it: " + refused(err).Error()})
				continue
			}
			id, err := c.Redrive(ctx, d)
			if err != nil {
				v.Results = append(v.Results, actionResult{Seq: seq, Text: refused(err).Error()})
				continue
			}
			v.Results = append(v.Results, actionResult{Seq: seq, OK: true, Text: fmt.Sprintf("redriven as job %s (key %q); the dead letter is deleted", id, d.Key)})
		}
	}
	code := http.StatusOK
	for _, res := range v.Results {
		if !res.OK && v.Error == "" {
			v.Error = "statuspage: some of it failed: see below"
		}
	}
	switch {
	case v.Refused:
		code = http.StatusForbidden
		v.Error = "the NATS server refused: this console's credentials do not allow it. " + v.Error
	case v.Error != "":
		code = http.StatusBadGateway
	}
	h.render(w, code, "result", v)
}

// sameOrigin refuses a POST another site's page sent: a browser names
// the sending page's origin (Origin) and, lately, whether it was this
// site (Sec-Fetch-Site).
func sameOrigin(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return fmt.Errorf("statuspage: refused a %s request (Sec-Fetch-Site): actions are taken from this console's own pages only; nothing was done", s)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("statuspage: refused a request from origin %q to %q: actions are taken from this console's own pages only; nothing was done", o, r.Host)
		}
	}
	return nil
}

// render executes the named template into w with status code.
func (h *handler) render(w http.ResponseWriter, code int, name string, data any) {
	var body bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&body, name, data); err != nil {
		http.Error(w, "statuspage: rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body.Bytes())
}
