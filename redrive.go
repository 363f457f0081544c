package keylane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// A redrive keeps the new job's outcome under the dead-lettered job's ID
// too: the worker writes, with its own permission, an outcome on the
// original submitter's behalf. The Keylane-Redrive-Of header a job carries
// is only a hint. The authority is a redrive ticket in the results bucket,
// under a key no job ID can be ("redrive/<new job ID>": job IDs never hold
// '/'), which only the operator's path writes: under
// docs/security/accounts.conf a client cannot publish to $KV.<NS>_RESULTS.>
// at all. The worker honours the hint only when the ticket, read from the
// results stream's leader, names this job, its key, type and payload, and
// the original ID; anywhere else the job runs as an ordinary job. See
// jetstream/doc.go, "Redrive".

// headerRedriveTicket marks a redrive ticket (its value: the new job's ID);
// the worker's own outcome puts never carry it.
const headerRedriveTicket = "Keylane-Redrive-Ticket"

// redriveTicketPrefix starts a ticket's key in the results bucket.
const redriveTicketPrefix = "redrive/"

// redriveTicket is the value of a redrive ticket.
type redriveTicket struct {
	Job     string `json:"job"`  // the redriven job's ID
	Of      string `json:"of"`   // the dead-lettered job's ID
	Key     string `json:"key"`  // the job's key
	Type    string `json:"type"` // the job's type
	Payload string `json:"payload_sha256"`
}

func payloadDigest(p []byte) string {
	sum := sha256.Sum256(p)
	return hex.EncodeToString(sum[:])
}

// writeRedriveTicket stores the ticket that lets the worker keep job id's
// outcome under d.JobID too. The results bucket's TTL bounds its life.
func (c *Client) writeRedriveTicket(ctx context.Context, id string, d DeadLetter) error {
	v, err := json.Marshal(redriveTicket{Job: id, Of: d.JobID, Key: d.Key, Type: d.Type, Payload: payloadDigest(d.Payload)})
	if err != nil {
		return err
	}
	m := nats.NewMsg("$KV." + c.names.Results() + "." + redriveTicketPrefix + id)
	m.Header.Set(headerRedriveTicket, id)
	m.Data = v
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("keylane: write the redrive ticket of %s (an operator's permission: publish to $KV.%s.%s>): %w", id, c.names.Results(), redriveTicketPrefix, err)
	}
	return nil
}

// checkRedrive settles whether t's Keylane-Redrive-Of is honoured: it
// reads t's redrive ticket from the results stream's leader. With no
// ticket, or one that does not match t, the hint is dropped (t then keeps
// its outcome under its own ID only) and nil returned; a failed read
// returns its error, for the caller to try again (keepEncoded does, with
// backoff, while the tenure lasts).
func (o *owner) checkRedrive(t *task) error {
	if t.redriveOf == "" || t.redriveChecked {
		return nil
	}
	results := o.w.topo.Names.Results()
	ctx, cancel := context.WithTimeout(o.ctx, requestTimeout)
	m, err := leaderGet(ctx, o.w.nc, "KV_"+results, "$KV."+results+"."+redriveTicketPrefix+t.job.ID)
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
	var tk redriveTicket
	switch {
	case err != nil:
		why = "no redrive ticket (never written by an operator, or expired with the results TTL)"
	case h.Get(headerRedriveTicket) != t.job.ID:
		why = "the redrive ticket's entry is not a ticket"
	case json.Unmarshal(v, &tk) != nil:
		why = "the redrive ticket does not decode"
	case tk.Job != t.job.ID || tk.Of != t.redriveOf || tk.Key != t.job.Key || tk.Type != t.job.Type || tk.Payload != payloadDigest(t.job.Payload):
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

// redriveID is the redriven job's ID: the same for the same dead letter,
// so redriving it twice stores one job. It is the original's ID (or, for a
// job sent without a valid one, its partition's) with the dead letter's
// sequence and a digest that takes in the time the job was dead-lettered,
// which only those who may read the dead-letter stream know: a submitter
// cannot take the ID first and have the operator's redrive dropped as a
// duplicate.
func redriveID(d DeadLetter) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d\x00%d\x00%d\x00%s", d.Seq, d.Partition, d.Time.UnixNano(), d.JobID))
	tag := strconv.FormatUint(d.Seq, 10) + "-" + hex.EncodeToString(sum[:6])
	if d.JobID == "" || ValidateJobID(d.JobID) != nil {
		return "redrive-p" + strconv.Itoa(d.Partition) + "-" + tag
	}
	if id := d.JobID + ".redrive-" + tag; ValidateJobID(id) == nil {
		return id
	}
	long := sha256.Sum256([]byte(d.JobID))
	return "redrive-" + tag + "-" + hex.EncodeToString(long[:12])
}
