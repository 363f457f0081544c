package tenure

import (
	"errors"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// Outcomes as the tenure keeps and replies them: package wire's encoding
// (wire.EncodeOutcome), which core.DecodeOutcome reads back into a
// *RemoteError.

// encodeResult is the outcome of a job that returned res and err (dead:
// it was dead-lettered).
func encodeResult(res []byte, err error, dead bool) []byte {
	if err == nil {
		return wire.EncodeOutcome(wire.OutcomeOK, res)
	}
	kind := byte(wire.OutcomeError)
	switch errorKind(err, dead) {
	case wire.KindDead:
		kind = wire.OutcomeDead
	case wire.KindPermanent:
		kind = wire.OutcomePermanent
	}
	return wire.EncodeOutcome(kind, []byte(errMessage(err)))
}

// errMessage is the text a reply or a kept outcome carries for err: a
// *RemoteError (an outcome kept earlier, answered again) carries its
// Message, the text its first reply had, not Error(), which prefixes its
// kind ("keylane: job failed (dead-lettered): ") and would grow a prefix
// at every replay.
func errMessage(err error) string {
	if re, ok := err.(*core.RemoteError); ok {
		return re.Message
	}
	return err.Error()
}

// replyMsg is the reply carrying a job's outcome.
func replyMsg(subject string, res []byte, herr error, dead bool) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: res}
	if herr != nil {
		m.Header = nats.Header{}
		m.Header.Set(wire.HeaderError, errorText(errMessage(herr)))
		m.Header.Set(wire.HeaderErrorKind, errorKind(herr, dead))
	}
	return m
}

// errorText is a reply's error text, never empty (core.ErrorText).
func errorText(s string) string { return core.ErrorText(s) }

// errorKind is the HeaderErrorKind of an outcome's error.
func errorKind(err error, dead bool) string {
	switch {
	case dead:
		return wire.KindDead
	case errors.Is(err, core.ErrPermanent):
		return wire.KindPermanent
	default:
		return wire.KindError
	}
}

// Grouped replies: package wire's (wire.AppendGroupedEntry).
const (
	resultOK       = wire.OutcomeOK
	groupedVersion = wire.GroupedVersion
	groupedToken   = wire.GroupedMark
)

func groupedEntrySize(token string, outcomeLen int) int {
	return wire.GroupedEntrySize(token, outcomeLen)
}

func appendGroupedEntry(buf []byte, token string, kind byte, rest []byte) []byte {
	return wire.AppendGroupedEntry(buf, token, kind, rest)
}

func validReply(reply, prefix string) bool { return wire.ValidateReply(reply, prefix) == nil }
