package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/keylane/keylane/partition"
)

// Batch messages: many jobs of one partition in one stream message, their
// fields in the body instead of headers (see "Batches on the wire" in
// package jetstream's doc).
//
// The body is, in this order and with nothing after the last job:
//
//	"KLB" and the version byte (BatchVersion)
//	uvarint   job count, 1 to MaxBatchJobs
//	per job:
//	  uvarint length and bytes of the key, the job ID, the type, the reply
//	  byte      flags: batchKeepOutcome, batchIdempotent; no other bit
//	  uvarint   header count; per header, names strictly ascending:
//	            uvarint length and name, uvarint value count, per value
//	            uvarint length and value
//	  uvarint length and bytes of the payload
//
// Every uvarint is in its shortest form, so a body that decodes is the
// one EncodeBatch writes for what it decoded to: one body, one reading.

// Batch message header, subject token and limits.
const (
	// HeaderBatch marks a batch message and gives its body's version.
	HeaderBatch = "Keylane-Batch"
	// HeaderBatchJobs gives a batch message's job count (decimal), so
	// what counts jobs (Client.Backlog, Inspect, the worker's backlog)
	// reads it without decoding the body; ParseBatch refuses a batch
	// whose body holds another count.
	HeaderBatchJobs = "Keylane-Batch-Jobs"
	// BatchVersion is the body format this package writes and reads.
	BatchVersion = 1
	// BatchToken is a batch's last subject token in its partition: five
	// letters, never a key's token (16 hex digits).
	BatchToken = "batch"
	// MaxBatchJobs is the most jobs one batch carries.
	MaxBatchJobs = 1024
	// MaxBatchBytes bounds the body of a batch of several jobs; the
	// server's max_payload bounds it further. A batch of one job is
	// bounded by max_payload alone: a job larger than any batch of
	// several travels as a batch of one, as large as the server takes.
	MaxBatchBytes = 8 << 20
)

const (
	batchMagic       = "KLB"
	batchKeepOutcome = 1 << 0
	batchIdempotent  = 1 << 1
	batchFlags       = batchKeepOutcome | batchIdempotent
)

var (
	// ErrBadBatch is returned for a batch body whose framing is broken:
	// the whole message is one malformed message.
	ErrBadBatch = errors.New("wire: malformed batch")
	// ErrBatchTooLarge is returned by EncodeBatch for no jobs, more than
	// MaxBatchJobs, or a body of several jobs over MaxBatchBytes.
	ErrBatchTooLarge = errors.New("wire: a batch holds 1 to 1024 jobs, several of them in at most 8 MiB")
)

// BatchJob is one job of a batch body, as sent: DecodeBatch returns the
// fields unchecked; Rules.ParseBatch checks them.
type BatchJob struct {
	Key, ID, Type, Reply string
	// KeepOutcome and Idempotent are the flags a one-job message carries
	// in Keylane-Keep-Outcome and Keylane-Idempotent.
	KeepOutcome, Idempotent bool
	// Header holds the submitter's own headers (traceparent among them).
	Header  map[string][]string
	Payload []byte
}

// BatchSubject returns the subject of partition p's batches, e.g.
// "keylane.jobs.3.batch": inside the partition's filter, never a key's.
func BatchSubject(namespace string, p int) string {
	return strings.TrimSuffix(partition.Filter(namespace, p), "*") + BatchToken
}

// BatchDeadID is the dead letter's ID of job index (from 0) of the batch
// stored at seq in the jobs stream of epoch: DeadID for index 0, which is
// a one-job message's, and one more "-index" token otherwise, so the
// dead letters of two jobs of one batch are never taken for duplicates
// of each other. JobIDOfDead never takes it for a job ID.
func BatchDeadID(epoch, seq uint64, index int) string {
	if index == 0 || seq == 0 {
		return DeadID(epoch, seq)
	}
	return DeadID(epoch, seq) + "-" + strconv.Itoa(index)
}

// BatchJobSize returns the bytes j adds to a batch body.
func BatchJobSize(j BatchJob) int {
	n := fieldSize(len(j.Key)) + fieldSize(len(j.ID)) + fieldSize(len(j.Type)) + fieldSize(len(j.Reply)) + 1 +
		uvarintSize(len(j.Header)) + fieldSize(len(j.Payload))
	for name, vs := range j.Header {
		n += fieldSize(len(name)) + uvarintSize(len(vs))
		for _, v := range vs {
			n += fieldSize(len(v))
		}
	}
	return n
}

// BatchHeaderSize is the bytes of a batch body before its jobs, at most.
const BatchHeaderSize = len(batchMagic) + 1 + binary.MaxVarintLen64

func fieldSize(n int) int { return uvarintSize(n) + n }

func uvarintSize(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(n))
}

// EncodeBatch returns the body of a batch of jobs. It checks only the
// batch's limits; each job's fields are checked where it was built, by
// the rules Rules.ParseBatch applies again on receipt.
func EncodeBatch(jobs []BatchJob) ([]byte, error) {
	if len(jobs) == 0 || len(jobs) > MaxBatchJobs {
		return nil, fmt.Errorf("%w (got %d jobs)", ErrBatchTooLarge, len(jobs))
	}
	size := len(batchMagic) + 1 + uvarintSize(len(jobs))
	for i := range jobs {
		size += BatchJobSize(jobs[i])
	}
	if size > MaxBatchBytes && len(jobs) > 1 {
		return nil, fmt.Errorf("%w (got %d bytes in %d jobs)", ErrBatchTooLarge, size, len(jobs))
	}
	b := make([]byte, 0, size)
	b = append(b, batchMagic...)
	b = append(b, BatchVersion)
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for i := range jobs {
		j := &jobs[i]
		for _, f := range []string{j.Key, j.ID, j.Type, j.Reply} {
			b = appendField(b, f)
		}
		var flags byte
		if j.KeepOutcome {
			flags |= batchKeepOutcome
		}
		if j.Idempotent {
			flags |= batchIdempotent
		}
		b = append(b, flags)
		names := make([]string, 0, len(j.Header))
		for name := range j.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		b = binary.AppendUvarint(b, uint64(len(names)))
		for _, name := range names {
			b = appendField(b, name)
			vs := j.Header[name]
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				b = appendField(b, v)
			}
		}
		b = appendField(b, j.Payload)
	}
	return b, nil
}

func appendField[T string | []byte](b []byte, f T) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

// batchReader reads a body strictly; the first broken frame sets err.
type batchReader struct {
	b   []byte
	i   int
	err error
}

func (r *batchReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at byte %d", ErrBadBatch, what, r.i)
	}
}

// uvarint reads a shortest-form uvarint of at most max.
func (r *batchReader) uvarint(what string, max int) int {
	if r.err != nil {
		return 0
	}
	n, w := binary.Uvarint(r.b[r.i:])
	if w <= 0 || n > uint64(max) || w != uvarintSize(int(n)) {
		r.fail("bad " + what)
		return 0
	}
	r.i += w
	return int(n)
}

// field reads a length-prefixed field, cut from the body with no spare
// capacity (appending to one field cannot overwrite the next).
func (r *batchReader) field(what string) []byte {
	if r.err != nil {
		return nil
	}
	n, w := binary.Uvarint(r.b[r.i:])
	if w <= 0 || n > uint64(len(r.b)-r.i-w) || w != uvarintSize(int(n)) {
		r.fail("bad length of the " + what)
		return nil
	}
	r.i += w
	f := r.b[r.i : r.i+int(n) : r.i+int(n)]
	r.i += int(n)
	return f
}

func (r *batchReader) readByte(what string) byte {
	if r.err != nil {
		return 0
	}
	if r.i >= len(r.b) {
		r.fail(what + " past the end")
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

// IsBatchBody reports whether body starts as a batch body does (its
// magic, "KLB"): what a batch message dead-lettered whole carries as its
// payload. It says nothing of the rest; DecodeBatch does.
func IsBatchBody(body []byte) bool {
	return len(body) >= len(batchMagic) && string(body[:len(batchMagic)]) == batchMagic
}

// DecodeBatch reads a batch body's framing and returns its jobs,
// unchecked (Rules.ParseBatch checks them). A wrong magic or version, a
// job count of 0 or over MaxBatchJobs, a body of several jobs over
// MaxBatchBytes (a batch of one is bounded by the message it came in,
// and so by the server's max_payload: its payload is cut from body, and
// nothing is allocated in proportion to its size), a
// length past the end, a uvarint not in its shortest form, an unknown
// flag, header names not strictly ascending, or bytes after the last
// job refuse the whole body with ErrBadBatch. Payloads are cut from
// body, which must not change while they are used.
func DecodeBatch(body []byte) ([]BatchJob, error) {
	if len(body) < len(batchMagic)+1 || string(body[:len(batchMagic)]) != batchMagic {
		return nil, fmt.Errorf("%w: no %q magic", ErrBadBatch, batchMagic)
	}
	if v := body[len(batchMagic)]; v != BatchVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrBadBatch, v, BatchVersion)
	}
	r := &batchReader{b: body, i: len(batchMagic) + 1}
	n := r.uvarint("job count", MaxBatchJobs)
	if r.err == nil && n == 0 {
		r.fail("no jobs")
	}
	if r.err == nil && n > 1 && len(body) > MaxBatchBytes {
		return nil, fmt.Errorf("%w: %d bytes in %d jobs, limit %d for a batch of several", ErrBadBatch, len(body), n, MaxBatchBytes)
	}
	// Each job takes at least 7 bytes: a count past what the body can
	// hold is refused before anything is allocated for it.
	if r.err == nil && n > (len(body)-r.i)/7 {
		r.fail("job count past the end")
	}
	if r.err != nil {
		return nil, r.err
	}
	jobs := make([]BatchJob, n)
	for k := 0; k < n && r.err == nil; k++ {
		j := &jobs[k]
		j.Key = string(r.field("key"))
		j.ID = string(r.field("job ID"))
		j.Type = string(r.field("type"))
		j.Reply = string(r.field("reply"))
		flags := r.readByte("flags")
		if flags&^batchFlags != 0 {
			r.fail("unknown flags")
		}
		j.KeepOutcome, j.Idempotent = flags&batchKeepOutcome != 0, flags&batchIdempotent != 0
		nh := r.uvarint("header count", (len(body)-r.i)/2)
		prev := ""
		for h := 0; h < nh && r.err == nil; h++ {
			name := string(r.field("header name"))
			if h > 0 && name <= prev {
				r.fail("header names not strictly ascending")
			}
			prev = name
			nv := r.uvarint("header value count", len(body)-r.i)
			vs := make([]string, 0, min(nv, 16))
			for v := 0; v < nv && r.err == nil; v++ {
				vs = append(vs, string(r.field("header value")))
			}
			if j.Header == nil {
				j.Header = make(map[string][]string, nh)
			}
			j.Header[name] = vs
		}
		j.Payload = r.field("payload")
	}
	if r.err == nil && r.i != len(body) {
		r.fail("bytes after the last job")
	}
	if r.err != nil {
		return nil, r.err
	}
	return jobs, nil
}

// BatchEntry is one job of a batch as Rules.ParseBatch read it.
type BatchEntry struct {
	// Job holds the fields that passed their rules, as Parse's Job: a
	// refused job's holds what may still be trusted (a reply subject to
	// tell the caller, an ID and key a dead letter may name).
	Job Job
	// Header is the job's own headers as sent; DeadHeader keeps only the
	// allowed ones.
	Header  map[string][]string
	Payload []byte
	// Err is why the job is refused (its dead letter's reason), nil for
	// a valid job.
	Err error
}

// ParseBatch reads and checks a received batch message of subject,
// header h and body. An error means the message as a whole is malformed
// (dead-lettered whole): a server header no job carries (Nats-Rollup,
// Nats-Schedule), a header given more than once, a Keylane-Redrive-Of
// (HeaderRedriveOf: a redrive's hint) on more than one job or naming no
// valid job ID, a subject that is not
// this partition's BatchSubject (on a namespace with a key backlog cap,
// Rules.MaxKeyBacklog: not its job's key's subject, or more than one
// job; see keyBatch), no Keylane-Batch of BatchVersion, a
// partition count other than the stream's, a batch ID (Nats-Msg-Id) that
// is not a valid job ID, a body DecodeBatch refuses, or a
// Keylane-Batch-Jobs (HeaderBatchJobs) missing or other than the body's
// job count (what counts jobs by it would miscount). Otherwise every
// job is checked by the rules of the one-job path (Parse), each on its
// own: a refused job's Err says why, and the other jobs are not
// affected. In order: the key (ValidateKey, and its partition), the
// reply (ValidateReply), the job ID (ValidateJobID; required: a batch
// has no sequence per job to name a job without one; a generated one
// not given twice in the batch), the type (ValidateType), the headers
// (ValidateUserHeader); then a job not marked idempotent must carry its
// batch's and index's ID (BatchedJobID of the batch's Nats-Msg-Id,
// which must be ValidBatchID). A job marked idempotent carries its
// caller's ID, which the worker de-duplicates (it looks the ID up
// before running the job and keeps its outcome by ID): the server
// de-duplicates no job of a batch, only the batch's own publish.
func (r Rules) ParseBatch(subject string, h map[string][]string, body []byte) ([]BatchEntry, error) {
	if _, ok := h[HeaderRunAt]; ok {
		return nil, fmt.Errorf("carries %s on subject %q: a delayed job's submission goes on its delay subject (ParseDelayedBatch)", HeaderRunAt, clip(subject))
	}
	return r.parseBatch(subject, h, body, true)
}

// parseBatch is ParseBatch; keyed is false for a delayed submission
// (ParseDelayedBatch), whose subject is its delay subject, checked there.
func (r Rules) parseBatch(subject string, h map[string][]string, body []byte, keyed bool) ([]BatchEntry, error) {
	for _, name := range []string{headerRollup, headerSchedule} {
		if _, ok := h[name]; ok {
			return nil, fmt.Errorf("carries %s, which keylane clients never send (the server acts on it when it stores the message)", name)
		}
	}
	for _, name := range []string{HeaderBatch, HeaderBatchJobs, HeaderPartitions, HeaderJobID, HeaderKey, HeaderDelayedID, HeaderReply, HeaderType, HeaderRedriveOf} {
		if n := len(h[name]); n > 1 {
			return nil, fmt.Errorf("%s header given %d times", name, n)
		}
	}
	switch {
	case !keyed:
	case r.MaxKeyBacklog > 0:
		if err := r.keySubject(subject); err != nil {
			return nil, err
		}
	default:
		if want := BatchSubject(r.Namespace, r.Partition); subject != want {
			return nil, fmt.Errorf("batch on subject %q, not this partition's %q", subject, want)
		}
	}
	if v := first(h, HeaderBatch); v != "1" {
		return nil, fmt.Errorf("%s is %q, this build reads batches of version %d", HeaderBatch, clip(v), BatchVersion)
	}
	for _, name := range []string{HeaderKey, HeaderDelayedID, HeaderReply, HeaderType} {
		if _, ok := h[name]; ok {
			return nil, fmt.Errorf("a batch carries %s (its jobs carry theirs in the body)", name)
		}
	}
	if n := first(h, HeaderPartitions); n != strconv.Itoa(r.Partitions) {
		return nil, fmt.Errorf("routed by a client that counts %s partitions, the jobs stream has %d: re-open the client", clip(n), r.Partitions)
	}
	batchID := first(h, HeaderJobID)
	if err := ValidateJobID(batchID); err != nil {
		return nil, fmt.Errorf("bad batch %s header: %w", HeaderJobID, err)
	}
	if !ValidBatchID(batchID) {
		// Its jobs' IDs are made of it (BatchedJobID), and a batch entry
		// of kept outcomes is keyed by it.
		return nil, fmt.Errorf("batch %s %q is not a batch ID (%d letters and digits)", HeaderJobID, clip(batchID), BatchIDLen)
	}
	jobs, err := DecodeBatch(body)
	if err != nil {
		return nil, err
	}
	if n := first(h, HeaderBatchJobs); n != strconv.Itoa(len(jobs)) {
		return nil, fmt.Errorf("%s is %q, the body holds %d jobs", HeaderBatchJobs, clip(n), len(jobs))
	}
	if r.MaxKeyBacklog > 0 && keyed {
		if err := r.keyBatch(subject, jobs); err != nil {
			return nil, err
		}
	}
	if of, ok := h[HeaderRedriveOf]; ok {
		// A redrive goes alone: its hint names one job's original.
		if len(jobs) != 1 {
			return nil, fmt.Errorf("%s on a batch of %d jobs (a redrive is a batch of one)", HeaderRedriveOf, len(jobs))
		}
		if err := ValidateJobID(first(h, HeaderRedriveOf)); err != nil {
			return nil, fmt.Errorf("bad %s header %q: %w", HeaderRedriveOf, clip(of[0]), err)
		}
	}
	out := make([]BatchEntry, len(jobs))
	seen := make(map[string]bool, len(jobs))
	for i := range jobs {
		out[i] = r.checkBatchJob(&jobs[i], seen)
		// A job of a batch is named either by its batch and its place in
		// it (a generated ID, BatchedJobID) or by its caller (marked
		// idempotent). The server de-duplicates no job of a batch, so a
		// job with a caller's ID is the worker's to de-duplicate: it is
		// looked up by its ID before it runs and its outcome kept by ID.
		// A job not so marked whose ID is not its batch's and index's
		// would claim another batch's job without being looked up.
		if want := BatchedJobID(batchID, i); jobs[i].ID != want && !jobs[i].Idempotent {
			if out[i].Err == nil {
				out[i].Err = fmt.Errorf("job ID %q in a batch, where job %d's ID is its batch's (%q) unless marked as its caller's", clip(jobs[i].ID), i, want)
			}
			out[i].Job.ID = "" // never trusted: its dead letter must not name the job it claims
		}
	}
	return out, nil
}

// A key backlog cap (Rules.MaxKeyBacklog) is the server's count of the
// messages of a key's subject (MaxMsgsPerSubject): a job counts only
// where it is a message of its key's subject. So on a capped namespace a
// batch message carries one job and travels on that job's key's subject;
// one on the batch subject, of more jobs, or on another key's subject
// would run jobs the server never counted against their key's cap.

// keySubject checks, on a capped namespace, that a batch's subject is a
// key's subject of this partition (keyBatch checks it is its job's).
func (r Rules) keySubject(subject string) error {
	prefix := strings.TrimSuffix(partition.Filter(r.Namespace, r.Partition), "*")
	token, ok := strings.CutPrefix(subject, prefix)
	switch {
	case ok && token == BatchToken:
		return fmt.Errorf("batch on subject %q on a namespace with a key backlog cap of %d: a batch there carries one job, on its key's subject, where the server counts it", subject, r.MaxKeyBacklog)
	case !ok || token == "" || strings.Contains(token, "."):
		return fmt.Errorf("batch on subject %q, not one of this partition's key subjects (%q and a key's token; a key backlog cap of %d)", subject, prefix, r.MaxKeyBacklog)
	}
	return nil
}

// keyBatch checks, on a capped namespace, that the batch of subject
// holds one job, of the key whose subject it is.
func (r Rules) keyBatch(subject string, jobs []BatchJob) error {
	if len(jobs) != 1 {
		return fmt.Errorf("batch of %d jobs on a namespace with a key backlog cap of %d: a batch there carries one job, which the server counts on its key's subject", len(jobs), r.MaxKeyBacklog)
	}
	if want := partition.Subject(r.Namespace, r.Partition, jobs[0].Key); subject != want {
		return fmt.Errorf("batch on subject %q, not its job's key %q's (%q): the key backlog cap of %d counts a job on its key's subject only", subject, clip(jobs[0].Key), want, r.MaxKeyBacklog)
	}
	return nil
}

// checkBatchJob checks one job of a batch; seen holds the IDs of the
// batch's jobs before it.
func (r Rules) checkBatchJob(b *BatchJob, seen map[string]bool) BatchEntry {
	e := BatchEntry{Header: b.Header, Payload: b.Payload}
	refuse := func(err error) {
		if e.Err == nil {
			e.Err = err
		}
	}
	switch err := ValidateKey(b.Key); {
	case err != nil:
		refuse(fmt.Errorf("bad key: %w", err))
	case r.Partitions > 0 && partition.Of(b.Key, r.Partitions) != r.Partition:
		refuse(fmt.Errorf("key %q belongs to partition %d, arrived on %d", b.Key, partition.Of(b.Key, r.Partitions), r.Partition))
	default:
		e.Job.Key = b.Key
	}
	if b.Reply != "" {
		if err := ValidateReply(b.Reply, r.ReplyPrefix); err != nil {
			refuse(fmt.Errorf("bad reply: %w", err))
		} else {
			e.Job.Reply = b.Reply
		}
	}
	switch err := ValidateJobID(b.ID); {
	case err != nil:
		refuse(fmt.Errorf("bad job ID: %w", err))
	case seen[b.ID] && !b.Idempotent:
		// Two jobs of one generated ID would be answered with each
		// other's outcome. Two of one caller's ID (a retry that met its
		// first copy in one batch) are one job: the worker runs the
		// first and answers the second from its kept outcome.
		refuse(fmt.Errorf("job ID %q given twice in the batch", b.ID))
	default:
		seen[b.ID] = true
		e.Job.ID = b.ID
	}
	if err := ValidateType(b.Type); err != nil {
		refuse(fmt.Errorf("bad type: %w", err))
	} else {
		e.Job.Type = b.Type
	}
	if err := validateHeadersInOrder(b.Header); err != nil {
		refuse(err)
	}
	e.Job.KeepOutcome, e.Job.Idempotent = b.KeepOutcome, b.Idempotent
	return e
}

// validateHeadersInOrder is ValidateUserHeaders in name order, so a job
// with several bad headers is refused for the same one every time.
func validateHeadersInOrder(h map[string][]string) error {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ValidateUserHeaders(map[string][]string{name: h[name]}); err != nil {
			return err
		}
	}
	return nil
}

func first(h map[string][]string, name string) string {
	if vs := h[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}
