package statestore

import (
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
)

// A state entry is one message: its value, the last job's outcome and the
// held window must fit in the server's max_payload together. The window
// gives way first (fit); what cannot fit without it is refused with
// core.ErrStateTooLarge, permanently, and the job is dead-lettered with that
// reason. Neither is a state-bucket outage: retrying the same write cannot
// make it fit (jetstream/doc.go, "Refusals").

// kvWriteHeaders is room for the headers of a KV compare-and-set write
// (NATS/1.0 and Nats-Expected-Last-Subject-Sequence with a 20-digit
// revision), which count towards max_payload with the value.
const kvWriteHeaders = 128

// maxEntry is the largest state entry one write carries now: the
// max_payload of the server the connection is on (it may change with a
// reconnect to another server) less the write's headers; 0 if not known.
func (s *Store) maxEntry() int {
	s.mu.Lock()
	nc := s.conn
	s.mu.Unlock()
	if nc == nil {
		return 0
	}
	return max(int(nc.MaxPayload())-kvWriteHeaders, 1)
}

// fit returns k's entry e with its held window shrunk, oldest outcomes
// first, until its encoding takes at most limit bytes, and that encoding.
// The last own outcomes of e.Recent (the group being written, applied
// now and not yet acked) are never dropped; if e does not fit with only
// those, fit returns a
// permanent core.ErrStateTooLarge. The entry returned has no held log: the
// next write builds one from it.
func fit(k string, e Entry, own, limit int) (Entry, []byte, error) {
	recent := e.Recent
	floor := max(len(recent)-own, 0) // Recent[floor:] must stay
	encode := func(from int) []byte {
		t := e
		t.Recent, t.view = recent[from:], nil
		return encodeState(t)
	}
	// The smallest cut that fits, by bisection (an encoding shrinks as
	// outcomes go, but for its first outcome, which is written in full),
	// then step by step should that guess not fit.
	lo, hi := 0, floor
	for lo < hi {
		mid := (lo + hi) / 2
		if len(encode(mid)) <= limit {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	for from := lo; from <= floor; from++ {
		if b := encode(from); len(b) <= limit {
			e.Recent, e.view = recent[from:], nil
			return e, b, nil
		}
	}
	return e, nil, core.Permanent(fmt.Errorf("%w (key %q: value %d bytes, result %d bytes, with its group's %d outcomes %d bytes; max_payload allows %d)",
		core.ErrStateTooLarge, keyOf(k), len(e.Value), len(e.Result), own, len(encode(floor)), limit))
}

// writeError is the error of a state write that did not go through
// (other than a lost compare-and-set): a refusal that retrying cannot cure
// (natserr.Permanent: over max_payload, an invalid key, a refused header)
// is permanent, the job's to be dead-lettered with it; anything else may
// have landed or may land on the next try: a *stateError, an outage.
func writeError(key string, err error) error {
	switch {
	case errors.Is(err, core.ErrPermanent):
		return err
	case natserr.IsPermanent(err):
		return core.Permanent(fmt.Errorf("keylane: state %q: write refused: %w", key, err))
	}
	return &core.StateError{Key: key, Err: err}
}
