package keylane

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

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
	HeaderRedriveOf = "Keylane-Redrive-Of"
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
	// ackPrefix starts the inbox token of a stream ack; result tokens are
	// groupedMark and base 36 (a previous build's: base 36 alone) and
	// never start with it.
	ackPrefix = "_"
	// groupedMark starts the reply token of a client that takes grouped
	// replies (one message answering several of its Calls). Base 36 never
	// holds it, so a previous build's tokens are never taken for one.
	groupedMark = "-"
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

// Outcome encoding. A reply carries the result as its data, or the error
// in HeaderError with its kind (HeaderErrorKind: "error", "permanent",
// "dead"); a kept outcome is one byte of kind and the result or the error
// text.
const (
	resultOK   = 'o'
	resultErr  = 'e'
	resultPerm = 'p'
	resultDead = 'd'
)

func encodeResult(res []byte, err error, dead bool) []byte {
	if err == nil {
		return append([]byte{resultOK}, res...)
	}
	kind := byte(resultErr)
	switch errorKind(err, dead) {
	case "dead":
		kind = resultDead
	case "permanent":
		kind = resultPerm
	}
	return append([]byte{kind}, errMessage(err)...)
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

func decodeResult(b []byte) ([]byte, error, bool) {
	if len(b) == 0 {
		return nil, nil, false
	}
	switch b[0] {
	case resultOK:
		return b[1:], nil, true
	case resultErr, resultPerm, resultDead:
		return nil, &RemoteError{Message: string(b[1:]), Permanent: b[0] != resultErr, DeadLettered: b[0] == resultDead}, true
	}
	return nil, nil, false
}

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

// errorText is a reply's error text, never empty (a client before
// decodeReply's header check read an empty Keylane-Error as a success).
func errorText(s string) string {
	if s == "" {
		return "(no error text)"
	}
	return s
}

// Grouped replies. The body is groupedVersion, then one entry per job:
// uvarint length and the job's reply token, uvarint length and its
// outcome as encodeResult writes it (a kept outcome's encoding: kind
// byte, then the result or the error text). No header, nothing after the
// last entry.
const (
	groupedVersion = 'G'
	// groupedTokenMax bounds a token in a grouped reply; ours are
	// groupedMark and at most 13 base 36 digits.
	groupedTokenMax = 64
)

// groupedEntry is one job's part of a grouped reply.
type groupedEntry struct {
	token   string
	outcome []byte // encodeResult's encoding
}

// groupedEntrySize is what an entry adds to a grouped reply's body.
func groupedEntrySize(token string, outcomeLen int) int {
	return uvarintLen(len(token)) + len(token) + uvarintLen(outcomeLen) + outcomeLen
}

// appendGroupedEntry appends one entry, its outcome being kind and then
// rest (the result or the error text), as encodeResult would write it.
func appendGroupedEntry(buf []byte, token string, kind byte, rest []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(token)))
	buf = append(buf, token...)
	buf = binary.AppendUvarint(buf, uint64(1+len(rest)))
	buf = append(buf, kind)
	return append(buf, rest...)
}

func uvarintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(n))
}

// errBadGrouped is why a grouped reply was dropped.
var errBadGrouped = errors.New("keylane: malformed grouped reply")

// decodeGrouped reads a grouped reply's body strictly: a wrong version, a
// token that is not a grouped client's, an outcome decodeResult refuses, a
// repeated token, a length past the end or bytes after the last entry
// refuse the whole message. Each outcome is cut from b with no spare
// capacity, so appending to one result cannot overwrite the next.
func decodeGrouped(b []byte) ([]groupedEntry, error) {
	if len(b) < 2 || b[0] != groupedVersion {
		return nil, errBadGrouped
	}
	var es []groupedEntry
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
		if !ok || len(tok) < 2 || len(tok) > groupedTokenMax || string(tok[:1]) != groupedMark || !base36(tok[1:]) || seen[string(tok)] {
			return nil, errBadGrouped
		}
		out, ok := field()
		if !ok {
			return nil, errBadGrouped
		}
		if _, _, ok := decodeResult(out); !ok {
			return nil, errBadGrouped
		}
		token := string(tok)
		seen[token] = true
		es = append(es, groupedEntry{token: token, outcome: out})
	}
	return es, nil
}

func base36[T string | []byte](b T) bool {
	for i := 0; i < len(b); i++ {
		if c := b[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

func errorKind(err error, dead bool) string {
	switch {
	case dead:
		return "dead"
	case errors.Is(err, ErrPermanent):
		return "permanent"
	default:
		return "error"
	}
}

// decodeReply reads a single reply. Any error header makes it an error,
// even an empty one: a worker before errorText sent an empty
// Keylane-Error for a handler error without text, and that must not read
// as a success.
func decodeReply(m *nats.Msg) ([]byte, error) {
	_, hasErr := m.Header[HeaderError]
	kind := m.Header.Get(HeaderErrorKind)
	if hasErr || kind != "" {
		return nil, &RemoteError{Message: errorText(m.Header.Get(HeaderError)), Permanent: kind == "permanent" || kind == "dead", DeadLettered: kind == "dead"}
	}
	return m.Data, nil
}

// pubAckError returns the error a stream ack carries, or nil for a good
// ack, and whether the ack says the job was a duplicate (stored earlier
// under this ID).
func pubAckError(m *nats.Msg) (dup bool, err error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return false, jetstream.ErrNoStreamResponse
	}
	hasErr, hasDup := bytes.Contains(m.Data, []byte(`"error"`)), bytes.Contains(m.Data, []byte(`"duplicate"`))
	if !hasErr && !hasDup {
		return false, nil
	}
	var resp struct {
		Error     *jetstream.APIError `json:"error"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Errorf("bad stream ack %q: %w", m.Data, err)
	}
	if resp.Error != nil {
		return false, resp.Error
	}
	return resp.Duplicate, nil
}

// natsError drops the second "nats: " of a nats.go error that wraps an
// APIError (whose own text starts with "nats: ") in one more "nats: ", as
// jetstream's publish does: "nats: nats: API error …" reads as a bug. The
// error stays in the chain for errors.Is and errors.As.
func natsError(err error) error { return natserr.Once(err) }
