package natserr

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Class is what a NATS or JetStream error says about trying again: every
// server refusal keylane meets is classified here, once, where the
// backend's codes are mapped (as nats.go's errors.go maps them).
type Class int

const (
	// Other is an error this package does not classify: nil, a context
	// cancelled by its owner, or an error that is not NATS's. The caller
	// decides by its own rule.
	Other Class = iota
	// Transient is a failure that a reconnect, an election or a moment
	// cures: a timeout, no responders (a stream or an API without a leader
	// right now), 503 (cluster or group not available), a connection being
	// re-established. Retried with backoff.
	Transient
	// Permanent is a refusal that no retry of the same request cures: a bad
	// subject or key, a message over max_payload or the stream's maximum
	// message size, a header the stream refuses (schedules 10188, atomic
	// batches 10174…), replicas above 1 on a server that is not clustered
	// (10074), a permissions violation, a closed connection. It becomes a
	// clear error for a caller, or a dead letter with that reason.
	Permanent
	// Conflict is a compare-and-set that lost to another writer (wrong
	// last sequence, 10071 and 10164; a KV key that exists): read again and
	// decide again. Neither an outage nor the job's fault.
	Conflict
	// Limit is a stream or bucket at a configured limit (10077 but for a
	// per-subject cap: maximum messages or bytes with DiscardNew; 10023,
	// the account's storage used up): it lasts
	// until something is removed. A publisher is told at once; a writer
	// that must not drop its write (a state entry of an applied job) waits
	// for room with backoff, as for an outage.
	Limit
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Conflict:
		return "conflict"
	case Limit:
		return "limit"
	}
	return "other"
}

// JetStream error codes nats.go names no constant for.
const (
	codeClusterNotAvailable jetstream.ErrorCode = 10008
	// codeInsufficientResources (10023, 503): the account's or server's
	// storage is used up.
	codeInsufficientResources jetstream.ErrorCode = 10023
	codeStreamNotMatch        jetstream.ErrorCode = 10060
	codeReplicasNotSupported  jetstream.ErrorCode = 10074
	// CodeStreamStoreFailed (10077, HTTP 503) carries the store's reason:
	// "maximum messages per subject exceeded" (a per-subject cap with
	// DiscardNewPerSubject: a refusal) or another limit of the store.
	CodeStreamStoreFailed      jetstream.ErrorCode = 10077
	codeMessageTTLDisabled     jetstream.ErrorCode = 10166
	codeAtomicPublishDisabled  jetstream.ErrorCode = 10174
	codeAtomicPublishMissSeq   jetstream.ErrorCode = 10175
	codeAtomicPublishIncompl   jetstream.ErrorCode = 10176
	codeAtomicPublishBadID     jetstream.ErrorCode = 10179
	codeAtomicPublishTooLarge  jetstream.ErrorCode = 10199
	codeAtomicPublishBadCommit jetstream.ErrorCode = 10200
)

// CodeReplicasNotSupported is the server's refusal of replicas above 1
// when it is not part of a cluster (10074, "replicas > 1 not supported in
// non-clustered mode").
const CodeReplicasNotSupported = codeReplicasNotSupported

// permanentCodes are API errors no retry of the same request cures,
// whatever their HTTP-like status (10074 comes as 500).
var permanentCodes = map[jetstream.ErrorCode]bool{
	jetstream.JSErrCodeStreamMessageExceedsMaximum: true, // 10054
	jetstream.JSErrCodeStreamNotFound:              true, // 10059
	codeStreamNotMatch:                             true, // 10060, Nats-Expected-Stream
	codeReplicasNotSupported:                       true, // 10074
	codeMessageTTLDisabled:                         true, // 10166, Nats-TTL
	codeAtomicPublishDisabled:                      true, // 10174, Nats-Batch-*
	codeAtomicPublishMissSeq:                       true,
	codeAtomicPublishIncompl:                       true,
	codeAtomicPublishBadID:                         true,
	codeAtomicPublishTooLarge:                      true,
	codeAtomicPublishBadCommit:                     true,
	jetstream.JSErrCodeMessageSchedulesDisabled:    true, // 10188, Nats-Schedule*
	jetstream.JSErrCodeSchedulePatternInvalid:      true,
	jetstream.JSErrCodeScheduleTargetInvalid:       true,
	jetstream.JSErrCodeScheduleTTLInvalid:          true,
	jetstream.JSErrCodeScheduleRollupInvalid:       true,
	jetstream.JSErrCodeScheduleSourceInvalid:       true,
}

// transientCodes are refusals with a 4xx status that a cluster cures by
// itself: placement while a node is down or being replaced, a membership
// change or a stream move or reconfiguration in flight. A Setup that gave
// up on them would fail a worker started during a rolling restart.
var transientCodes = map[jetstream.ErrorCode]bool{
	10005: true, // no suitable peers for placement (a node is down)
	10040: true, // peer not a member
	10044: true, // server is not a member of the cluster (yet)
	10124: true, // stream move already in progress
	10202: true, // cluster member change is in progress
	10226: true, // stream reconfiguration already in progress
}

// Classify says whether err is worth trying again. Its rules, first match:
//
//   - a lost compare-and-set (10071, 10164, "key exists") is Conflict;
//   - an API error: a code in the permanent list is Permanent; 10077 is
//     Permanent for a per-subject cap ("maximum messages per subject
//     exceeded"), Limit otherwise (a full stream or bucket), and so is
//     10023 (the account's storage used up); 10008, the cluster's
//     placement and membership refusals (transientCodes) and every
//     503, 408 (request timeout) and other 5xx are Transient; any other
//     (400, 404, …: the request itself was refused) is Permanent;
//   - nats.go's own refusals before sending (invalid subject, invalid
//     key, maximum payload exceeded, headers not supported), a
//     permissions or authorization violation, a closed connection, and
//     jetstream.ErrInvalidStreamName are Permanent;
//   - timeouts (nats.ErrTimeout, context.DeadlineExceeded), no responders
//     (nats.ErrNoResponders, jetstream.ErrNoStreamResponse: no leader
//     during an election; a publish to a subject no stream has also says
//     so, and only a look at the stream tells them apart), a connection
//     being re-established, no servers and a full reconnect buffer are
//     Transient;
//   - anything else, nil and context.Canceled are Other.
func Classify(err error) Class {
	if err == nil {
		return Other
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		return Conflict
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return classifyAPI(apiErr)
	}
	switch {
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, jetstream.ErrInvalidKey),
		errors.Is(err, jetstream.ErrInvalidSubject), errors.Is(err, jetstream.ErrInvalidStreamName),
		errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrHeadersNotSupported),
		errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrBadHeaderMsg):
		return Permanent
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrReconnectBufExceeded):
		return Transient
	}
	return Other
}

func classifyAPI(e *jetstream.APIError) Class {
	switch {
	case e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence,
		e.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return Conflict
	case permanentCodes[e.ErrorCode]:
		return Permanent
	case transientCodes[e.ErrorCode]:
		return Transient
	case e.ErrorCode == CodeStreamStoreFailed:
		if PerSubjectCap(e) {
			return Permanent
		}
		return Limit
	case e.ErrorCode == codeInsufficientResources:
		return Limit
	case e.ErrorCode == codeClusterNotAvailable, e.Code == 408, e.Code >= 500:
		return Transient
	}
	return Permanent
}

// PerSubjectCap reports whether err is the server's refusal of a message
// over a subject's cap (MaxMsgsPerSubject with DiscardNewPerSubject):
// error 10077, "maximum messages per subject exceeded".
func PerSubjectCap(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == CodeStreamStoreFailed &&
		strings.Contains(apiErr.Description, "maximum messages per subject exceeded")
}

// IsPermanent reports whether Classify(err) is Permanent.
func IsPermanent(err error) bool { return Classify(err) == Permanent }

// IsTransient reports whether Classify(err) is Transient.
func IsTransient(err error) bool { return Classify(err) == Transient }
