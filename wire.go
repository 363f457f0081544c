package keylane

import (
	"github.com/keylane/keylane/internal/client"
	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/namespace"
	"github.com/keylane/keylane/wire"
)

// The wire vocabulary of the API: the headers of job, reply and
// dead-letter messages (package wire's), the metadata keys of the jobs
// stream (package namespace's), and the reading of outcomes, kept and
// grouped (package wire's encoding). Subjects are package partition's
// (partition.Subject, partition.DeadSubject); object names are Names'.
// The rest of the vocabulary the tests of this package use is in
// wirehooks_test.go.

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

// decodeResult reads an outcome: the result, or a *RemoteError; ok is
// false for one wire.DecodeOutcome refuses.
func decodeResult(b []byte) (_ []byte, _ error, ok bool) { return core.DecodeOutcome(b) }

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
	es, err := wire.DecodeGrouped(data)
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
