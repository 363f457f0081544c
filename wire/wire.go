// Package wire is keylane's door: how a job message is built and read, and
// what a dead letter carries, in pure functions both sides share. The
// client checks every field with the rule the worker checks it with again
// on receipt (a job may come from anyone allowed to publish, not only
// from a keylane client), so nothing the client refuses can be stored by
// another path and run.
//
// One rule per field:
//
//   - Key: ValidateKey (package partition's rule: 1 to 1024 bytes of
//     UTF-8, no control character, no white space at either end).
//   - Job ID: ValidateJobID: 1 to 256 of A-Z a-z 0-9 _ - = and dots, a dot
//     never first, last or next to another, so the ID is always a key the
//     results bucket can hold (its subject has no empty token).
//   - Type: ValidateType: up to 256 bytes of UTF-8, no control
//     character, no white space at either end; empty means none.
//   - Reply subject: ValidateReply: a plain subject under the topology's
//     reply prefix.
//   - User headers: ValidateUserHeader: no Nats-* (the server acts on
//     them: roll-ups, schedules, batches, TTLs), no Keylane-* (keylane's
//     own), no Status or Description (nats.go reads them as a status on a
//     message without payload); names as nats.go accepts them, values that
//     arrive as sent (no CR, LF or white space at either end).
//
// Rules.Parse reads a received job; DeadHeader builds a dead letter's
// headers from what Parse accepted plus the allowed user headers, never
// from the received Nats-*/Keylane-* headers, so a dead letter is always
// one the dead-letter stream stores.
//
// Nothing here talks to a server. Every function is safe for concurrent
// use.
package wire

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/keylane/keylane/partition"
)

// Header names on job, reply and dead-letter messages. The job ID travels
// in the standard Nats-Msg-Id header so the server de-duplicates submits.
const (
	HeaderJobID     = "Nats-Msg-Id"
	HeaderKey       = "Keylane-Key"
	HeaderType      = "Keylane-Type"
	HeaderReply     = "Keylane-Reply"
	HeaderError     = "Keylane-Error"
	HeaderErrorKind = "Keylane-Error-Kind"
	HeaderAttempts  = "Keylane-Attempts"
	HeaderWorker    = "Keylane-Worker"
	HeaderSeq       = "Keylane-Seq"
	HeaderPartition = "Keylane-Partition"
	HeaderFence     = "Keylane-Fence"
	// HeaderPayloadDropped on a dead letter gives the length of a payload
	// left out because the dead letter would not have fit max_payload.
	HeaderPayloadDropped = "Keylane-Payload-Dropped"
	// HeaderPartitions carries the partition count the client routed the
	// job with; a worker refuses a job routed with another N.
	HeaderPartitions = "Keylane-Partitions"
	// HeaderIdempotent marks a job whose ID the caller chose and may retry
	// with: workers keep its outcome by ID for the results TTL.
	HeaderIdempotent = "Keylane-Idempotent"
	// HeaderKeepOutcome asks the worker to keep the job's outcome by ID
	// (every Call does, so a reply lost with a connection is recovered).
	HeaderKeepOutcome = "Keylane-Keep-Outcome"
	// HeaderDelayedID carries a delayed job's ID: the server leaves
	// Nats-Msg-Id out of the job it stores when the job is due.
	HeaderDelayedID = "Keylane-Job-Id"
	// HeaderRedriveOf names, on a redrive (a batch of one), the
	// dead-lettered job it replaces: a hint, which the worker honours only
	// when an operator's redrive ticket says so.
	HeaderRedriveOf = "Keylane-Redrive-Of"
)

// Server headers a received job may not carry (see Rules.Parse).
const (
	// headerRollup makes the server purge the subject (the key's queued
	// jobs) when it stores the message.
	headerRollup = "Nats-Rollup"
	// headerSchedule makes the message a schedule, not a job.
	headerSchedule = "Nats-Schedule"
	// headerScheduler names the schedule a message stored by the server
	// when a schedule fired was made from.
	headerScheduler = "Nats-Scheduler"
	// headerScheduleTarget is the subject a schedule stores its message on.
	headerScheduleTarget = "Nats-Schedule-Target"
	// headerStreamSource is set by the server on a message a stream
	// sourced from another; it refuses it from publishers (error 10227).
	headerStreamSource = "Nats-Stream-Source"
)

// Limits of the fields.
const (
	// MaxJobIDLen is the longest job ID, in bytes.
	MaxJobIDLen = 256
	// MaxTypeLen is the longest job type, in bytes.
	MaxTypeLen = 256
	// MaxHeaderNameLen is the longest user header name, in bytes.
	MaxHeaderNameLen = 256
)

var (
	// ErrBadJobID is returned for a job ID keylane cannot carry.
	ErrBadJobID = errors.New("wire: job ID must be 1-256 characters of A-Z a-z 0-9 _ - = and single dots between them")
	// ErrBadType is returned for a job type keylane cannot carry.
	ErrBadType = errors.New("wire: job type must be at most 256 bytes of UTF-8 without control characters or white space at either end")
	// ErrBadReply is returned for a reply subject a worker may not publish to.
	ErrBadReply = errors.New("wire: reply subject is not a plain subject under the reply prefix")
	// ErrReservedHeader is returned for a user header under Nats-* or
	// Keylane-*, or named Status or Description.
	ErrReservedHeader = errors.New("wire: header is reserved (Nats-* for the server, Keylane-* for keylane, Status and Description for nats.go)")
	// ErrBadHeader is returned for a user header whose name or value would
	// not arrive as sent.
	ErrBadHeader = errors.New("wire: header name must be printable ASCII without \"(),/:;<=>?@[\\]{} and its value hold no CR, LF or white space at either end")
)

// ValidateKey reports why key cannot be used as a resource key, or nil:
// package partition's rule, which routing and the worker share.
func ValidateKey(key string) error { return partition.ValidateKey(key) }

// ValidateJob reports why a client may not send j, a job it built, or
// nil: each field by its rule, in this order, the first refusal only:
// the key (ValidateKey), the type (ValidateType), the submitter's
// headers (ValidateUserHeaders), the reply subject under replyPrefix
// when j has one (ValidateReply), the job ID when j has one
// (ValidateJobID: an ID the client generates is valid by construction).
// The worker applies the same rules on receipt (Rules.ParseBatch).
func ValidateJob(j BatchJob, replyPrefix string) error {
	if err := ValidateKey(j.Key); err != nil {
		return err
	}
	if err := ValidateType(j.Type); err != nil {
		return err
	}
	if err := ValidateUserHeaders(j.Header); err != nil {
		return err
	}
	if j.Reply != "" {
		if err := ValidateReply(j.Reply, replyPrefix); err != nil {
			return err
		}
	}
	if j.ID != "" {
		return ValidateJobID(j.ID)
	}
	return nil
}

// ValidateJobID reports why id cannot be used as a job ID, or nil. The
// results bucket keeps outcomes under the job ID, so an ID is always a
// valid KV key: no dot first, last or next to another.
func ValidateJobID(id string) error {
	ok := len(id) >= 1 && len(id) <= MaxJobIDLen && id[0] != '.' && id[len(id)-1] != '.'
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '=' || c == '-' ||
			c == '.' && id[i-1] != '.'
	}
	if !ok {
		return fmt.Errorf("%w (got %q)", ErrBadJobID, clip(id))
	}
	return nil
}

// ValidateType reports why typ cannot be used as a job type, or nil. The
// empty type is none and valid.
func ValidateType(typ string) error {
	if len(typ) > MaxTypeLen || !utf8.ValidString(typ) || !clean(typ) {
		return fmt.Errorf("%w (got %q)", ErrBadType, clip(typ))
	}
	return nil
}

// clean reports whether s has no control character and no white space at
// either end: it arrives in a header value as sent.
func clean(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	if s == "" {
		return true
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	return !unicode.IsSpace(first) && !unicode.IsSpace(last)
}

// ValidateReply reports why reply is not a plain subject under prefix (a
// topology's reply prefix, ending in '.'), or nil: a worker replies
// nowhere else, so a job cannot steer it into the server's APIs or
// keylane's own subjects.
func ValidateReply(reply, prefix string) error {
	if prefix == "" || len(reply) <= len(prefix) || !strings.HasPrefix(reply, prefix) {
		return fmt.Errorf("%w %q (got %q)", ErrBadReply, prefix, clip(reply))
	}
	for rest := reply[len(prefix):]; ; {
		tok, after, more := strings.Cut(rest, ".")
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("%w %q (got %q)", ErrBadReply, prefix, clip(reply))
		}
		if !more {
			return nil
		}
		rest = after
	}
}

// ValidateUserHeader reports why a submitter's own header name: value
// cannot travel with a job, or nil. Reserved names are matched without
// regard to case. The W3C traceparent and tracestate headers the client's
// tracing writes are ordinary user headers here.
func ValidateUserHeader(name, value string) error {
	if reservedHeader(name) {
		return fmt.Errorf("%w: %q", ErrReservedHeader, clip(name))
	}
	if !validHeaderName(name) {
		return fmt.Errorf("%w: name %q", ErrBadHeader, clip(name))
	}
	if !validHeaderValue(value) {
		return fmt.Errorf("%w: %s value %q", ErrBadHeader, name, clip(value))
	}
	return nil
}

// ValidateUserHeaders checks every name and value of h with
// ValidateUserHeader, in no particular order, and returns the first
// refusal.
func ValidateUserHeaders(h map[string][]string) error {
	for k, vs := range h {
		for _, v := range vs {
			if err := ValidateUserHeader(k, v); err != nil {
				return err
			}
		}
		if len(vs) == 0 {
			if err := ValidateUserHeader(k, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

func reservedHeader(name string) bool {
	return hasPrefixFold(name, "Nats-") || hasPrefixFold(name, "Keylane-") ||
		strings.EqualFold(name, "Status") || strings.EqualFold(name, "Description")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// validHeaderName is nats.go's rule for a header name (printable ASCII
// but "(),/:;<=>?@[\]{}), which refuses the whole publish otherwise.
func validHeaderName(name string) bool {
	if name == "" || len(name) > MaxHeaderNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 33 || c > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue: nats.go trims ASCII white space at both ends of a
// value it sends and turns CR and LF into spaces; a value that would
// change is refused instead.
func validHeaderValue(v string) bool {
	if strings.ContainsAny(v, "\r\n\x00") {
		return false
	}
	return v == "" || !isASCIISpace(v[0]) && !isASCIISpace(v[len(v)-1])
}

func isASCIISpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// clip bounds what an error quotes of a refused value.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
