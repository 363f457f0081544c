package tenure

import (
	"strings"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// Held jobs. A worker that holds a stored job without running it until an
// operator acts (today: a key whose state was written under another jobs
// stream, ErrEpoch, until its epoch is adopted) tells the job's Call so
// once, on a subject of its own under the Call's inbox: the reply token
// with heldMark before it. A client of an earlier build has no waiter for
// that token and drops the notice, as before; its Call waits as it did.

// heldMark starts the token of a held notice: heldMark and the Call's own
// reply token. Neither base 36, the client's ack prefix nor groupedMark
// holds it.
const heldMark = core.HeldMark

// heldKindEpoch is the HeaderErrorKind of a notice for a job held for
// ErrEpoch.
const heldKindEpoch = core.HeldKindEpoch

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
	return &nats.Msg{Subject: subject, Header: nats.Header{wire.HeaderError: {errorText(why.Error())}, wire.HeaderErrorKind: {heldKindEpoch}}}
}

// sayHeld tells t's Call, once a task, that its job is held for why; a
// job without a reply subject, or already replied to, is told nothing.
// Like a reply, it is sent only while the lease is trusted.
func (o *Owner) sayHeld(t *task, why error) {
	reply := t.msg.Headers().Get(wire.HeaderReply)
	if reply == "" || t.replied {
		return
	}
	m := heldMsg(reply, why)
	if m == nil || !o.l.Trusted() {
		return
	}
	if err := o.nc.PublishMsg(m); err != nil {
		o.log.Warn("held notice", "job_id", t.job.ID, "err", err)
	}
}
