package keylane

import (
	"github.com/keylane/keylane/internal/client"
	"github.com/keylane/keylane/internal/jsbatch"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The wire vocabulary, in one place: the headers of job, reply and
// dead-letter messages, the metadata keys of the jobs stream, the tokens
// of the client's reply subjects, and the outcome encoding that replies
// and kept outcomes (the results bucket) share. Subjects are package
// partition's (partition.Subject, partition.DeadSubject); object names are
// Names'.

// Header names on job, reply and dead-letter messages, package wire's. The
// job ID travels in the standard Nats-Msg-Id header so the server
// de-duplicates submits.
const (
	HeaderJobID     = wire.HeaderJobID
	HeaderKey       = wire.HeaderKey
	HeaderType      = wire.HeaderType
	HeaderReply     = wire.HeaderReply
	HeaderError     = wire.HeaderError
	HeaderErrorKind = wire.HeaderErrorKind
	HeaderAttempts  = wire.HeaderAttempts
	HeaderWorker    = wire.HeaderWorker
	HeaderSeq       = wire.HeaderSeq
	HeaderPartition = wire.HeaderPartition
	HeaderFence     = wire.HeaderFence
	// HeaderPayloadDropped on a dead letter gives the length of a payload
	// left out because the dead letter would not have fit max_payload.
	HeaderPayloadDropped = wire.HeaderPayloadDropped
	// HeaderPartitions carries the partition count the client routed the
	// job with; a worker refuses a job routed with another N.
	HeaderPartitions = wire.HeaderPartitions
	// HeaderIdempotent marks a job whose ID the caller chose and may retry
	// with: workers keep its outcome by ID for the results TTL.
	HeaderIdempotent = wire.HeaderIdempotent
	// HeaderKeepOutcome asks the worker to keep the job's outcome by ID
	// (every Call does, so a reply lost with a connection is recovered).
	HeaderKeepOutcome = wire.HeaderKeepOutcome
	// HeaderRedriveOf names the dead-lettered job a redriven job replaces:
	// the worker keeps the new outcome under that ID too.
	HeaderRedriveOf = wire.HeaderRedriveOf
)

// Metadata keys written into the jobs stream's configuration (package
// namespace's).
const (
	MetaPartitions = namespace.MetaPartitions
	MetaHash       = namespace.MetaHash
	MetaVersion    = namespace.MetaVersion
	// MetaEpoch identifies the jobs stream (hex); see Meta.Epoch.
	MetaEpoch = namespace.MetaEpoch
	// MetaAdopted lists adopted epochs (hex, comma-separated).
	MetaAdopted = namespace.MetaAdopted
	// MetaReplyPrefix is where workers may reply.
	MetaReplyPrefix = namespace.MetaReplyPrefix
	// MetaShards is S, how many jobs streams the namespace's partitions
	// are spread over; absent means 1.
	MetaShards = namespace.MetaShards
	// MetaShard is the stream's own shard index in [0, S); absent means 0.
	MetaShard = namespace.MetaShard
)

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
// a *RemoteError here.
const (
	resultOK   = wire.OutcomeOK
	resultErr  = wire.OutcomeError
	resultPerm = wire.OutcomePermanent
	resultDead = wire.OutcomeDead
)

// decodeResult reads an outcome: the result, or a *RemoteError; ok is
// false for one wire.DecodeOutcome refuses.
func decodeResult(b []byte) (_ []byte, _ error, ok bool) { return core.DecodeOutcome(b) }

// errorText is a reply's error text, never empty (core.ErrorText).
func errorText(s string) string { return core.ErrorText(s) }

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

// natsError drops the second "nats: " of a nats.go error that wraps an
// APIError (whose own text starts with "nats: ") in one more "nats: ", as
// jetstream's publish does: "nats: nats: API error …" reads as a bug. The
// error stays in the chain for errors.Is and errors.As.
func natsError(err error) error { return natserr.Once(err) }

// ReplyOutcome is one Call's outcome in a grouped reply: the reply token
// of its Call (the last token of the Call's reply subject) and its result
// or error (a *RemoteError), as Call would return them.
type ReplyOutcome struct {
	Token  string
	Result []byte
	Err    error
}

// DecodeGroupedReply reads a grouped reply: a message a worker sent to a
// client's inbox with the token "-" (subject "<inbox>.-"), which carries
// the outcomes of several of that client's Calls (see jetstream/doc.go,
// "Grouped replies"). Client does this itself; it is for tools that watch
// replies on the wire (tests, debugging). A malformed body is an error.
func DecodeGroupedReply(data []byte) ([]ReplyOutcome, error) {
	es, err := decodeGrouped(data)
	if err != nil {
		return nil, err
	}
	out := make([]ReplyOutcome, len(es))
	for i, e := range es {
		res, rerr, _ := client.GroupedOutcome(e.Outcome) // as Call gets it
		out[i] = ReplyOutcome{Token: e.Token, Result: res, Err: rerr}
	}
	return out, nil
}
