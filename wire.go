package keylane

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/keylane/keylane/internal/core"
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

// Metadata keys written into the jobs stream's configuration.
const (
	MetaPartitions = "keylane.partitions"
	MetaHash       = "keylane.hash"
	MetaVersion    = "keylane.version"
	// MetaEpoch identifies the jobs stream (hex); see Meta.Epoch.
	MetaEpoch = "keylane.epoch"
	// MetaAdopted lists adopted epochs (hex, comma-separated).
	MetaAdopted = "keylane.adopted"
	// MetaReplyPrefix is where workers may reply.
	MetaReplyPrefix = "keylane.reply-prefix"
	// MetaShards is S, how many jobs streams the namespace's partitions
	// are spread over; absent means 1.
	MetaShards = "keylane.shards"
	// MetaShard is the stream's own shard index in [0, S); absent means 0.
	MetaShard = "keylane.shard"
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

// JetStream atomic batches (nats-server 2.12 and later, on a stream with
// AllowAtomicPublish): messages 1..n carry the batch's ID and their
// sequence, the last also the commit; the server stores all or none, and
// acks the commit only, naming the batch and its size.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// markBatch makes m message seq (from 1) of atomic batch id, and its
// commit when last. It sets m's headers in place.
func markBatch(m *nats.Msg, id string, seq int, last bool) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[batchIDHeader] = []string{id}
	m.Header[batchSeqHeader] = []string{strconv.Itoa(seq)}
	if last {
		m.Header[batchCommitHeader] = oneHeader
	} else {
		delete(m.Header, batchCommitHeader)
	}
}

// unmarkBatch removes the batch headers from m.
func unmarkBatch(m *nats.Msg) {
	delete(m.Header, batchIDHeader)
	delete(m.Header, batchSeqHeader)
	delete(m.Header, batchCommitHeader)
}

// errBatchIgnored is a good ack of a batch's commit that does not name the
// batch: the server (before 2.12) ignored the batch headers and stored the
// messages one by one, the earlier ones unacknowledged.
var errBatchIgnored = errors.New("keylane: the server acked the batch commit as a single message (atomic batches need nats-server 2.12)")

// batchStored returns nil if m, the ack of a batch commit, says the server
// stored atomic batch id of n messages; else the ack's error, or
// errBatchIgnored.
func batchStored(m *nats.Msg, id string, n int) error {
	if _, err := pubAckError(m); err != nil {
		return err
	}
	var ack struct {
		Batch string `json:"batch"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return fmt.Errorf("bad stream ack %q: %w", m.Data, err)
	}
	if ack.Batch != id || ack.Count != n {
		return errBatchIgnored
	}
	return nil
}

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
	if re, ok := err.(*RemoteError); ok {
		return re.Message
	}
	return err.Error()
}

// decodeResult reads an outcome: the result, or a *RemoteError; ok is
// false for one wire.DecodeOutcome refuses.
func decodeResult(b []byte) (_ []byte, _ error, ok bool) { return core.DecodeResult(b) }

// replyMsg is the reply carrying a job's outcome.
func replyMsg(subject string, res []byte, herr error, dead bool) *nats.Msg {
	m := &nats.Msg{Subject: subject, Data: res}
	if herr != nil {
		m.Header = nats.Header{}
		m.Header.Set(HeaderError, errorText(errMessage(herr)))
		m.Header.Set(HeaderErrorKind, errorKind(herr, dead))
	}
	return m
}

// errorText is a reply's error text, never empty (core.ErrorText).
func errorText(s string) string { return core.ErrorText(s) }

// Grouped replies: package wire's (wire.DecodeGrouped).
const (
	groupedVersion  = wire.GroupedVersion
	groupedTokenMax = wire.GroupedTokenMax
)

type groupedEntry = wire.GroupedEntry

func groupedEntrySize(token string, outcomeLen int) int {
	return wire.GroupedEntrySize(token, outcomeLen)
}

func appendGroupedEntry(buf []byte, token string, kind byte, rest []byte) []byte {
	return wire.AppendGroupedEntry(buf, token, kind, rest)
}

var errBadGrouped = wire.ErrBadGrouped

func decodeGrouped(b []byte) ([]groupedEntry, error) { return wire.DecodeGrouped(b) }

func errorKind(err error, dead bool) string {
	switch {
	case dead:
		return wire.KindDead
	case errors.Is(err, ErrPermanent):
		return wire.KindPermanent
	default:
		return wire.KindError
	}
}

// pubAckError returns the error a stream ack carries, or nil for a good
// ack, and whether the ack says the job was a duplicate (natserr.AckError).
func pubAckError(m *nats.Msg) (dup bool, err error) { return natserr.AckError(m) }

// natsError drops the second "nats: " of a nats.go error that wraps an
// APIError (whose own text starts with "nats: ") in one more "nats: ", as
// jetstream's publish does: "nats: nats: API error …" reads as a bug. The
// error stays in the chain for errors.Is and errors.As.
func natsError(err error) error { return natserr.Once(err) }
