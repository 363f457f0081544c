package tenure

import (
	"strings"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// Grouped replies: a group commit settles many jobs of one key, most of
// them, on a hot key, Calls of the same Client. Their replies go to that
// client's inbox as one message, which the client hands out to its
// waiting Calls by token. Only clients whose reply tokens start with
// groupedMark get one (a previous build's never do), and only for two or
// more jobs to the same inbox; the rest are replied to one by one by
// finish, as before. See jetstream/doc.go, "Grouped replies".

// replyGrouped sends the replies of settled tasks (outcomes already kept)
// grouped by client inbox, while the lease is trusted, and marks the tasks
// it answered so finish does not reply again. A grouped message never
// exceeds the connection's max_payload: it is split, and a reply too big
// to share a message is left to finish. A publish that fails is logged,
// as finish logs a failed reply: the caller recovers the kept outcome.
func (o *Owner) replyGrouped(ts []*task, out [][]byte) {
	if len(ts) < 2 {
		return
	}
	var inboxes []string
	byInbox := map[string][]int{}
	for i, t := range ts {
		inbox, ok := groupedInbox(t.msg.Headers().Get(wire.HeaderReply))
		if !ok {
			continue
		}
		if byInbox[inbox] == nil {
			inboxes = append(inboxes, inbox)
		}
		byInbox[inbox] = append(byInbox[inbox], i)
	}
	limit := int(o.nc.MaxPayload())
	for _, inbox := range inboxes {
		idx := byInbox[inbox]
		if len(idx) < 2 {
			continue
		}
		subject := inbox + groupedToken
		if !validReply(subject, o.topo.Meta.ReplyPrefix) {
			continue
		}
		total := 1
		for _, i := range idx {
			total += groupedEntrySize(ts[i].msg.Headers().Get(wire.HeaderReply)[len(inbox):], 1+len(out[i]))
		}
		var body []byte
		var sent []int
		flush := func() bool {
			if len(sent) >= 2 { // one alone goes the plain way, through finish
				if !o.l.Trusted() {
					return false
				}
				if err := o.nc.PublishMsg(&nats.Msg{Subject: subject, Data: body}); err != nil {
					o.log.Warn("grouped reply", "jobs", len(sent), "err", err)
				}
				for _, i := range sent {
					ts[i].replied = true
				}
			}
			if body != nil {
				total -= len(body) - 1
			}
			body, sent = nil, sent[:0]
			return true
		}
		for _, i := range idx {
			token := ts[i].msg.Headers().Get(wire.HeaderReply)[len(inbox):]
			n := groupedEntrySize(token, 1+len(out[i]))
			if 1+n > limit {
				total -= n
				continue // finish replies alone
			}
			if len(body)+n > limit && !flush() {
				return
			}
			if body == nil {
				body = append(make([]byte, 0, min(total, limit)), groupedVersion)
			}
			body = appendGroupedEntry(body, token, resultOK, out[i])
			sent = append(sent, i)
		}
		if !flush() {
			return
		}
	}
}

// groupedInbox returns the inbox of a reply subject whose token says its
// client takes grouped replies, in the form decodeGrouped accepts (any
// other token, even one that starts with groupedMark, is replied to alone:
// it would make the client drop the whole grouped message).
func groupedInbox(reply string) (string, bool) {
	dot := strings.LastIndexByte(reply, '.')
	tok := reply[dot+1:]
	if dot < 0 || !wire.ValidGroupedToken(tok) {
		return "", false
	}
	return reply[:dot+1], true
}
