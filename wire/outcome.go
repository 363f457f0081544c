package wire

import (
	"encoding/binary"
	"errors"
)

// Outcomes: the one encoding of a job's outcome that kept outcomes (the
// results bucket, a batch's outcomes entry, a state entry's held window)
// and grouped replies share. An outcome is one byte of kind, then the
// result (OutcomeOK) or the error text (any other kind). A reply that is
// not grouped carries the same: the result as its data, or the error
// text in HeaderError with its kind's name (KindName) in
// HeaderErrorKind.
const (
	OutcomeOK        = 'o'
	OutcomeError     = 'e' // the handler's error: retried, or failed after retries
	OutcomePermanent = 'p' // refused for good (keylane.Permanent)
	OutcomeDead      = 'd' // dead-lettered
)

// Error kinds, as HeaderErrorKind carries them.
const (
	KindError     = "error"
	KindPermanent = "permanent"
	KindDead      = "dead"
)

// EncodeOutcome returns an outcome of kind: the kind byte, then rest (the
// result, or the error text).
func EncodeOutcome(kind byte, rest []byte) []byte {
	return append([]byte{kind}, rest...)
}

// DecodeOutcome splits an outcome into its kind and the result or error
// text, which aliases b. ok is false for an empty outcome or an unknown
// kind: a reader never guesses.
func DecodeOutcome(b []byte) (kind byte, rest []byte, ok bool) {
	if len(b) == 0 {
		return 0, nil, false
	}
	switch b[0] {
	case OutcomeOK, OutcomeError, OutcomePermanent, OutcomeDead:
		return b[0], b[1:], true
	}
	return 0, nil, false
}

// KindName is the HeaderErrorKind of an error outcome's kind ("" for
// OutcomeOK or an unknown kind).
func KindName(kind byte) string {
	switch kind {
	case OutcomeError:
		return KindError
	case OutcomePermanent:
		return KindPermanent
	case OutcomeDead:
		return KindDead
	}
	return ""
}

// Grouped replies: one message carrying the outcomes of many Calls of one
// client, each under its reply token. The body is GroupedVersion, then
// one entry per job: uvarint length and the job's reply token, uvarint
// length and its outcome (EncodeOutcome's encoding). No header, nothing
// after the last entry.
const (
	GroupedVersion = 'G'
	// GroupedMark starts the reply token of a client that takes grouped
	// replies; the rest of the token is base 36.
	GroupedMark = "-"
	// GroupedTokenMax bounds a token in a grouped reply.
	GroupedTokenMax = 64
)

// GroupedEntry is one job's part of a grouped reply.
type GroupedEntry struct {
	Token   string
	Outcome []byte // EncodeOutcome's encoding
}

// GroupedEntrySize is what an entry adds to a grouped reply's body.
func GroupedEntrySize(token string, outcomeLen int) int {
	return uvarintSize(len(token)) + len(token) + uvarintSize(outcomeLen) + outcomeLen
}

// AppendGroupedEntry appends one entry, its outcome being kind and then
// rest (the result or the error text), as EncodeOutcome writes it.
func AppendGroupedEntry(buf []byte, token string, kind byte, rest []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(token)))
	buf = append(buf, token...)
	buf = binary.AppendUvarint(buf, uint64(1+len(rest)))
	buf = append(buf, kind)
	return append(buf, rest...)
}

// ErrBadGrouped is why a grouped reply was dropped whole.
var ErrBadGrouped = errors.New("wire: malformed grouped reply")

// DecodeGrouped reads a grouped reply's body strictly: a wrong version, a
// token that is not a grouped client's (GroupedMark and base 36, at most
// GroupedTokenMax bytes), an outcome DecodeOutcome refuses, a repeated
// token, a length past the end or bytes after the last entry refuse the
// whole message (ErrBadGrouped). Each outcome is cut from b with no spare
// capacity, so appending to one result cannot overwrite the next.
func DecodeGrouped(b []byte) ([]GroupedEntry, error) {
	if len(b) < 2 || b[0] != GroupedVersion {
		return nil, ErrBadGrouped
	}
	var es []GroupedEntry
	seen := map[string]bool{}
	for i := 1; i < len(b); {
		field := func() ([]byte, bool) {
			n, w := binary.Uvarint(b[i:])
			if w <= 0 || n > uint64(len(b)-i-w) {
				return nil, false
			}
			i += w
			f := b[i : i+int(n) : i+int(n)]
			i += int(n)
			return f, true
		}
		tok, ok := field()
		if !ok || !ValidGroupedToken(string(tok)) || seen[string(tok)] {
			return nil, ErrBadGrouped
		}
		out, ok := field()
		if !ok {
			return nil, ErrBadGrouped
		}
		if _, _, ok := DecodeOutcome(out); !ok {
			return nil, ErrBadGrouped
		}
		token := string(tok)
		seen[token] = true
		es = append(es, GroupedEntry{Token: token, Outcome: out})
	}
	return es, nil
}

// ValidGroupedToken reports whether tok is a grouped client's reply
// token: GroupedMark, then 1 to GroupedTokenMax-1 base 36 digits.
func ValidGroupedToken(tok string) bool {
	if len(tok) < 2 || len(tok) > GroupedTokenMax || tok[:1] != GroupedMark {
		return false
	}
	for i := 1; i < len(tok); i++ {
		if c := tok[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}
