package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Outcomes kept per batch (see "Batches on the wire" in package
// jetstream's doc): a batch message's Calls have their outcomes kept in
// one results-bucket entry, keyed by the batch's ID (BatchOutcomesKey),
// instead of one entry per job. A batched Call's job ID names its batch
// and its index (BatchedJobID), so both its client and a worker asked
// for it by ID find the entry, and the entry names each outcome's job ID,
// which the reader checks against the one it looks for: an entry that
// holds another job at that index is refused, never read as its outcome.
//
// The entry's value is, in this order and with nothing after the last
// outcome:
//
//	"KLO" and the version byte (OutcomesVersion)
//	uvarint   length and bytes of the batch ID (ValidBatchID)
//	uvarint   outcome count, 1 to MaxBatchJobs
//	per outcome, indexes strictly ascending:
//	  uvarint index in the batch, below MaxBatchJobs
//	  uvarint length and bytes of the job ID (BatchedJobID of the batch
//	          ID and the index)
//	  uvarint length and bytes of the outcome (keylane's result encoding,
//	          at least one byte)
//
// Every uvarint is in its shortest form: one value, one reading.

const (
	// OutcomesVersion is the entry format this package writes and reads.
	OutcomesVersion = 1
	// BatchOutcomesPrefix starts a batch entry's key in the results
	// bucket; '/' never occurs in a job ID, so it is no job's key.
	BatchOutcomesPrefix = "batch/"
)

const outcomesMagic = "KLO"

// ErrBadOutcomes is returned for a batch entry that does not decode, or
// that is not the one asked for (another batch's, another job at the
// index): never legit, for only workers write the entries.
var ErrBadOutcomes = errors.New("wire: malformed batch outcomes entry")

// ErrNoBatchOutcome is returned for a well-formed entry of the batch
// asked for that holds no outcome at the index asked for: a legit case
// (a job of the batch that keeps no outcome in it, such as a Submit, or
// one whose outcome is kept by its ID). It is not ErrBadOutcomes.
var ErrNoBatchOutcome = errors.New("wire: batch outcomes entry holds no outcome for the job")

// BatchOutcome is one job's kept outcome in a batch entry.
type BatchOutcome struct {
	Index int
	ID    string
	// Value is the outcome as keylane encodes a kept result.
	Value []byte
}

// BatchOutcomesKey is the results-bucket key of batch batchID's entry.
func BatchOutcomesKey(batchID string) string { return BatchOutcomesPrefix + batchID }

// BatchIDLen is the length of a batch ID whose Calls have their outcomes
// kept per batch: 22 letters and digits, random as the client generates
// it. Job IDs of that form with a '.' and an index after it are rare
// among callers' own, so a caller's ID is seldom looked for in a batch
// entry as well.
const BatchIDLen = 22

// ValidBatchID reports whether id can name a batch entry: BatchIDLen
// ASCII letters and digits.
func ValidBatchID(id string) bool {
	if len(id) != BatchIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// BatchedJobID is the job ID of a Call at index in batch batchID: the
// batch ID, a '.', and the index in decimal.
func BatchedJobID(batchID string, index int) string {
	return batchID + "." + strconv.Itoa(index)
}

// ParseBatchedJobID splits a job ID made by BatchedJobID. ok is false
// for any other ID (no dot, an index that is not the shortest decimal
// below MaxBatchJobs, or a batch ID that is not ValidBatchID).
func ParseBatchedJobID(id string) (batchID string, index int, ok bool) {
	dot := strings.LastIndexByte(id, '.')
	if dot <= 0 {
		return "", 0, false
	}
	batchID, digits := id[:dot], id[dot+1:]
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || n >= MaxBatchJobs || strconv.Itoa(n) != digits || !ValidBatchID(batchID) {
		return "", 0, false
	}
	return batchID, n, true
}

// EncodeBatchOutcomes returns the entry holding outs, the outcomes of
// batch batchID's jobs, indexes strictly ascending, each job's ID its
// BatchedJobID. It refuses anything DecodeBatchOutcomes would.
func EncodeBatchOutcomes(batchID string, outs []BatchOutcome) ([]byte, error) {
	if err := checkOutcomes(batchID, outs); err != nil {
		return nil, err
	}
	size := len(outcomesMagic) + 1 + fieldSize(len(batchID)) + uvarintSize(len(outs))
	for _, o := range outs {
		size += uvarintSize(o.Index) + fieldSize(len(o.ID)) + fieldSize(len(o.Value))
	}
	if size > MaxBatchBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBadOutcomes, size, MaxBatchBytes)
	}
	b := make([]byte, 0, size)
	b = append(b, outcomesMagic...)
	b = append(b, OutcomesVersion)
	b = appendField(b, batchID)
	b = appendUvarint(b, len(outs))
	for _, o := range outs {
		b = appendUvarint(b, o.Index)
		b = appendField(b, o.ID)
		b = appendField(b, o.Value)
	}
	return b, nil
}

// DecodeBatchOutcomes reads a batch entry. A wrong magic or version, a
// value over MaxBatchBytes, a count of 0 or over MaxBatchJobs, indexes
// not strictly ascending, a job ID that is not its BatchedJobID, an empty
// outcome, a length past the end, a uvarint not in its shortest form or
// bytes after the last outcome refuse it with ErrBadOutcomes. Values are
// cut from b.
func DecodeBatchOutcomes(b []byte) (batchID string, outs []BatchOutcome, err error) {
	if len(b) > MaxBatchBytes {
		return "", nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBadOutcomes, len(b), MaxBatchBytes)
	}
	if len(b) < len(outcomesMagic)+1 || string(b[:len(outcomesMagic)]) != outcomesMagic {
		return "", nil, fmt.Errorf("%w: no %q magic", ErrBadOutcomes, outcomesMagic)
	}
	if v := b[len(outcomesMagic)]; v != OutcomesVersion {
		return "", nil, fmt.Errorf("%w: version %d, this build reads %d", ErrBadOutcomes, v, OutcomesVersion)
	}
	r := &batchReader{b: b, i: len(outcomesMagic) + 1}
	batchID = string(r.field("batch ID"))
	n := r.uvarint("outcome count", MaxBatchJobs)
	if r.err == nil && n == 0 {
		r.fail("no outcome")
	}
	for i := 0; r.err == nil && i < n; i++ {
		var o BatchOutcome
		o.Index = r.uvarint("index", MaxBatchJobs-1)
		o.ID = string(r.field("job ID"))
		o.Value = r.field("outcome")
		outs = append(outs, o)
	}
	if r.err == nil && r.i != len(b) {
		r.fail("bytes after the last outcome")
	}
	if r.err != nil {
		return "", nil, fmt.Errorf("%w%s", ErrBadOutcomes, strings.TrimPrefix(r.err.Error(), ErrBadBatch.Error()))
	}
	if err := checkOutcomes(batchID, outs); err != nil {
		return "", nil, err
	}
	return batchID, outs, nil
}

// checkOutcomes is the rules an entry's fields keep.
func checkOutcomes(batchID string, outs []BatchOutcome) error {
	if !ValidBatchID(batchID) {
		return fmt.Errorf("%w: batch ID %q is not %d letters and digits", ErrBadOutcomes, clip(batchID), BatchIDLen)
	}
	if len(outs) == 0 || len(outs) > MaxBatchJobs {
		return fmt.Errorf("%w: %d outcomes, 1 to %d", ErrBadOutcomes, len(outs), MaxBatchJobs)
	}
	for i, o := range outs {
		switch {
		case o.Index < 0 || o.Index >= MaxBatchJobs || i > 0 && o.Index <= outs[i-1].Index:
			return fmt.Errorf("%w: index %d out of order or range", ErrBadOutcomes, o.Index)
		case o.ID != BatchedJobID(batchID, o.Index):
			return fmt.Errorf("%w: job ID %q at index %d of batch %q", ErrBadOutcomes, clip(o.ID), o.Index, batchID)
		case len(o.Value) == 0:
			return fmt.Errorf("%w: empty outcome at index %d", ErrBadOutcomes, o.Index)
		}
	}
	return nil
}

// FindBatchOutcome returns job id's outcome in entry b, the entry of batch
// batchID, where id is at index. The entry must be that batch's and hold
// that job at that index: a garbled or forged entry, another batch's, or
// another job at that index is ErrBadOutcomes, never another job's
// outcome; the entry of that batch without an outcome at that index is
// ErrNoBatchOutcome.
func FindBatchOutcome(b []byte, batchID string, index int, id string) ([]byte, error) {
	got, outs, err := DecodeBatchOutcomes(b)
	if err != nil {
		return nil, err
	}
	if got != batchID {
		return nil, fmt.Errorf("%w: entry of batch %q read for batch %q", ErrBadOutcomes, got, batchID)
	}
	for _, o := range outs {
		if o.Index == index {
			if o.ID != id {
				return nil, fmt.Errorf("%w: job %q at index %d, not %q", ErrBadOutcomes, clip(o.ID), index, clip(id))
			}
			return o.Value, nil
		}
	}
	return nil, fmt.Errorf("%w: batch %q holds none at index %d (job %q)", ErrNoBatchOutcome, batchID, index, clip(id))
}

func appendUvarint(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}
