package keylane

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// Held jobs. A worker that holds a stored job without running it until an
// operator acts (today: a key whose state was written under another jobs
// stream, ErrEpoch, until its epoch is adopted) tells the job's Call so
// once, on a subject of its own under the Call's inbox: the reply token
// with heldMark before it. A client of an earlier build has no waiter for
// that token and drops the notice, as before; its Call waits as it did.

// HeldError is ErrHeld for one job.
type HeldError struct {
	// JobID is the held job's ID: call again with it for its outcome.
	JobID string
	// Reason is the worker's: why the job is held and what releases it.
	Reason string
	// epoch: held for ErrEpoch.
	epoch bool
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("keylane: job %s is stored but held, not run: %s; call again with the same ID for its outcome once it runs", e.JobID, e.Reason)
}

func (e *HeldError) Unwrap() []error {
	if e.epoch {
		return []error{ErrHeld, ErrNoReply, ErrEpoch}
	}
	return []error{ErrHeld, ErrNoReply}
}

// heldMark starts the token of a held notice: heldMark and the Call's own
// reply token. Neither base 36, ackPrefix nor groupedMark holds it.
const heldMark = "="

// heldKindEpoch is the HeaderErrorKind of a notice for a job held for
// ErrEpoch.
const heldKindEpoch = "held-epoch"

// heldSubject is where a job with reply subject reply is told it is held,
// or "" if reply has no token to mark.
func heldSubject(reply string) string {
	dot := strings.LastIndexByte(reply, '.')
	if dot < 0 || dot == len(reply)-1 {
		return ""
	}
	return reply[:dot+1] + heldMark + reply[dot+1:]
}

// heldMsg is the notice that the job with reply subject reply is held for
// why (ErrEpoch), or nil if reply cannot carry one.
func heldMsg(reply string, why error) *nats.Msg {
	subject := heldSubject(reply)
	if subject == "" {
		return nil
	}
	return &nats.Msg{Subject: subject, Header: nats.Header{HeaderError: {errorText(why.Error())}, HeaderErrorKind: {heldKindEpoch}}}
}

// heldError decodes a held notice for job id.
func heldError(id string, m *nats.Msg) *HeldError {
	return &HeldError{JobID: id, Reason: errorText(m.Header.Get(HeaderError)), epoch: m.Header.Get(HeaderErrorKind) == heldKindEpoch}
}

// deliverHeld hands a held notice to the Call waiting on token.
func (c *Client) deliverHeld(token string, m *nats.Msg) {
	c.mu.Lock()
	w := c.waiters[token]
	c.mu.Unlock()
	if w == nil {
		return
	}
	select {
	case w.held <- m:
	default:
	}
}

// sayHeld tells t's Call, once a task, that its job is held for why; a
// job without a reply subject, or already replied to, is told nothing.
// Like a reply, it is sent only while the lease is trusted.
func (o *owner) sayHeld(t *task, why error) {
	reply := t.msg.Headers().Get(HeaderReply)
	if reply == "" || t.replied {
		return
	}
	m := heldMsg(reply, why)
	if m == nil || !o.l.Trusted() {
		return
	}
	if err := o.w.nc.PublishMsg(m); err != nil {
		o.log.Warn("held notice", "job_id", t.job.ID, "err", err)
	}
}
