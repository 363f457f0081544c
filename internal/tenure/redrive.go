package tenure

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go"
)

// HeaderRedriveTicket marks a redrive ticket (its value: the new job's ID);
// the worker's own outcome puts never carry it. See package keylane's
// redrive.go, which writes tickets (Client.Redrive).
const HeaderRedriveTicket = "Keylane-Redrive-Ticket"

// RedriveTicketPrefix starts a ticket's key in the results bucket.
const RedriveTicketPrefix = "redrive/"

// RedriveTicket is the value of a redrive ticket.
type RedriveTicket struct {
	Job     string `json:"job"`  // the redriven job's ID
	Of      string `json:"of"`   // the dead-lettered job's ID
	Key     string `json:"key"`  // the job's key
	Type    string `json:"type"` // the job's type
	Payload string `json:"payload_sha256"`
}

// PayloadDigest is a ticket's digest of a job's payload.
func PayloadDigest(p []byte) string {
	sum := sha256.Sum256(p)
	return hex.EncodeToString(sum[:])
}

// checkRedrive settles whether t's Keylane-Redrive-Of is honoured: it
// reads t's redrive ticket from the results stream's leader. With no
// ticket, or one that does not match t, the hint is dropped (t then keeps
// its outcome under its own ID only) and nil returned; a failed read
// returns its error, for the caller to try again (keepEncoded does, with
// backoff, while the tenure lasts).
func (o *Owner) checkRedrive(t *task) error {
	if t.redriveOf == "" || t.redriveChecked {
		return nil
	}
	results := o.topo.Names.Results()
	ctx, cancel := context.WithTimeout(o.ctx, core.RequestTimeout)
	m, err := leaderGet(ctx, o.nc, "KV_"+results, "$KV."+results+"."+RedriveTicketPrefix+t.job.ID)
	cancel()
	if err != nil && !errors.Is(err, errNoEntry) {
		return err
	}
	var h nats.Header
	var v []byte
	if m != nil {
		h, v = m.Header, m.Data
	}
	why := ""
	var tk RedriveTicket
	switch {
	case err != nil:
		why = "no redrive ticket (never written by an operator, or expired with the results TTL)"
	case h.Get(HeaderRedriveTicket) != t.job.ID:
		why = "the redrive ticket's entry is not a ticket"
	case json.Unmarshal(v, &tk) != nil:
		why = "the redrive ticket does not decode"
	case tk.Job != t.job.ID || tk.Of != t.redriveOf || tk.Key != t.job.Key || tk.Type != t.job.Type || tk.Payload != PayloadDigest(t.job.Payload):
		why = fmt.Sprintf("the redrive ticket is for job %s redriving %s (key %q, type %q), not this job", tk.Job, tk.Of, tk.Key, tk.Type)
	}
	if why != "" {
		o.log.Warn("Keylane-Redrive-Of ignored: the job runs as an ordinary job", "job_id", t.job.ID, "redrive_of", t.redriveOf, "why", why)
		t.redriveOf = ""
		return nil
	}
	t.redriveChecked = true
	return nil
}
