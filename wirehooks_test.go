package keylane

import (
	"github.com/keylane/keylane/internal/jsbatch"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The wire vocabulary the tests of this package use and the API does
// not: the tokens of the client's reply subjects, the outcome and
// grouped-reply encodings (package wire's), batch marks (internal/jsbatch)
// and stream acks (internal/natserr).

const (
	// expectStreamHeader makes the server refuse a job that would land in
	// another stream than ours.
	expectStreamHeader = jetstream.ExpectedStreamHeader
	// groupedMark starts the reply token of a client that takes grouped
	// replies (one message answering several of its Calls). Base 36 never
	// holds it, so a previous build's tokens are never taken for one.
	groupedMark = wire.GroupedMark
	// groupedToken is the inbox token grouped replies are sent to; a
	// waiter's token is groupedMark and at least one digit more.
	groupedToken = groupedMark
)

func markBatch(m *nats.Msg, id string, seq int, last bool) { jsbatch.Mark(m, id, seq, last) }

func batchStored(m *nats.Msg, id string, n int) error { return jsbatch.Stored(m, id, n) }

// oneHeader is the value of flag headers.
var oneHeader = []string{"1"}

// Outcomes: package wire's encoding (wire.EncodeOutcome), read back into
// a *RemoteError by decodeResult.
const (
	resultOK   = wire.OutcomeOK
	resultErr  = wire.OutcomeError
	resultPerm = wire.OutcomePermanent
	resultDead = wire.OutcomeDead
)

// Grouped replies: package wire's (wire.DecodeGrouped).
const groupedVersion = wire.GroupedVersion

type groupedEntry = wire.GroupedEntry

func appendGroupedEntry(buf []byte, token string, kind byte, rest []byte) []byte {
	return wire.AppendGroupedEntry(buf, token, kind, rest)
}

func decodeGrouped(b []byte) ([]groupedEntry, error) { return wire.DecodeGrouped(b) }

// pubAckError returns the error a stream ack carries, or nil for a good
// ack, and whether the ack says the job was a duplicate (natserr.AckError).
func pubAckError(m *nats.Msg) (dup bool, err error) { return natserr.AckError(m) }
