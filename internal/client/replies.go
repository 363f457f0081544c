package client

import (
	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// The replies a Call waits for, as they come to the client's inbox: a
// stream ack (its token starts with ackPrefix), a single reply (the
// Call's token), a grouped reply (token wire.GroupedMark: several Calls'
// outcomes in one message) and a held notice (core.HeldMark and the
// Call's token).

// ackPrefix starts the inbox token of a stream ack; result tokens are
// wire.GroupedMark and base 36 (a previous build's: base 36 alone) and
// never start with it.
const ackPrefix = "_"

// deliverGrouped hands each entry of a grouped reply to its Call. A
// malformed one is dropped whole: its Calls recover their outcomes from
// the results bucket, as after a lost reply (Call's replyWait).
func (c *Client) deliverGrouped(m *nats.Msg) {
	es, err := wire.DecodeGrouped(m.Data)
	if err != nil {
		return
	}
	for _, e := range es {
		// DecodeGrouped checked every entry's outcome.
		if res, err, ok := GroupedOutcome(e.Outcome); ok {
			c.deliverOutcome(e.Token, outcome{res, err})
		}
	}
}

// GroupedOutcome reads one entry's outcome of a grouped reply as Call
// delivers it: the same result and error as the single reply of that
// outcome (DecodeReply), decoded once. An error's text is never empty
// (core.ErrorText), as a single reply's is not; ok is false for an
// outcome core.DecodeOutcome refuses.
func GroupedOutcome(enc []byte) (res []byte, err error, ok bool) {
	res, err, ok = core.DecodeOutcome(enc)
	if re, isRemote := err.(*core.RemoteError); isRemote && re.Message == "" {
		re.Message = core.ErrorText("")
	}
	return res, err, ok
}

// heldError decodes a held notice for job id.
func heldError(id string, m *nats.Msg) *core.HeldError {
	return core.NewHeldError(id, core.ErrorText(m.Header.Get(wire.HeaderError)), m.Header.Get(wire.HeaderErrorKind) == core.HeldKindEpoch)
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

// DecodeReply reads a single reply. Any error header makes it an error,
// even an empty one: a worker before core.ErrorText sent an empty
// Keylane-Error for a handler error without text, and that must not read
// as a success.
func DecodeReply(m *nats.Msg) ([]byte, error) {
	_, hasErr := m.Header[wire.HeaderError]
	kind := m.Header.Get(wire.HeaderErrorKind)
	if hasErr || kind != "" {
		return nil, &core.RemoteError{Message: core.ErrorText(m.Header.Get(wire.HeaderError)), Permanent: kind == wire.KindPermanent || kind == wire.KindDead, DeadLettered: kind == wire.KindDead}
	}
	return m.Data, nil
}
