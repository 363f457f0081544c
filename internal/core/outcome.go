package core

import "github.com/keylane/keylane/wire"

// DecodeOutcome reads an outcome as a reply or the results bucket carries
// it (wire.EncodeOutcome): the result, or a *RemoteError; ok is false for
// one wire.DecodeOutcome refuses. The root's replies and internal/kept's
// look-ups read outcomes with it.
func DecodeOutcome(b []byte) (_ []byte, _ error, ok bool) {
	kind, rest, ok := wire.DecodeOutcome(b)
	switch {
	case !ok:
		return nil, nil, false
	case kind == wire.OutcomeOK:
		return rest, nil, true
	}
	return nil, &RemoteError{Message: string(rest), Permanent: kind != wire.OutcomeError, DeadLettered: kind == wire.OutcomeDead}, true
}
