package statestore

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
)

// Key is the KV key that holds a resource key's state: the key in
// unpadded base64url, since KV keys allow only a few characters.
func Key(key string) string {
	return "k." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// keyOf is the resource key of a state bucket key (Key's inverse).
func keyOf(k string) string {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, "k."))
	if err != nil {
		return k
	}
	return string(b)
}

// Entry encoding. Version 4, written since 2026-11-22: version (1 byte),
// fence (uvarint), epoch (8, big-endian), the count of held outcomes
// (uvarint), then each held outcome, oldest first and the last applied job
// last, as
//
//   - its stream sequence: the zigzag varint of the difference from the
//     previous outcome's (from 0 for the first); sequences of an adopted
//     stream may run backwards;
//   - its job ID: the length of the prefix it shares with the previous
//     outcome's ID (uvarint), the length of the rest (uvarint) and the rest.
//     IDs of one client share a long prefix (a nuid's first 12 characters,
//     a caller's run or order prefix);
//   - its result: 0 (uvarint) when it is the previous outcome's result byte
//     for byte (a sold-out SKU's "soldout 0"), else its length + 1
//     (uvarint) and the result;
//
// and the rest is the value. A hot key's entry holds up to HeldJobs
// outcomes and is rewritten by every group commit: version 3 took 14 bytes
// of lengths and sequence plus the whole ID per outcome: 51 bytes for the
// demo sale's 28-byte IDs and "sold N" results, which version 4 stores in
// 14, and in 5 once the results repeat (TestStateCodecCompactsAFullWindow).
// Every outcome version 3 held is held by version 4; only the bytes differ.
//
// Each outcome's encoding depends on the outcome before it only, and the
// first's on nothing (deltas from 0, nothing shared, a whole result). So
// the owner writes a hot key's next entry without encoding its window
// again (heldlog.go): it keeps the encodings of the outcomes after the
// first, appends the group's, encodes only the new first outcome on its
// own, and copies the rest. The bytes are encodeState's for the same
// entry (TestHeldLogMatchesFullPath), so version 4 stays: a worker that
// reads version 4 reads them, and no reader needs to change.
//
// Version 3: version (1 byte), fence (8), epoch (8), the count of held
// outcomes (2) and each as seq (8), ID length (2) and ID, result length (4)
// and result, the last applied job last; the rest is the value. Versions 1
// and 2 (seq, fence, job ID, result, and in 2 the earlier results of the
// same write) are still read, as is 3. A worker that reads only versions up
// to 3 refuses a version 4 entry with core.ErrBadState and dead-letters the
// key's jobs (jetstream/doc.go, "Outcomes are held"): upgrade every worker
// of a namespace before the new ones take partitions.
//
// Version 5 is version 4 with the last applied job's batch index
// (uvarint) after the epoch: written only when that index is not 0 (a job
// of a batch message, which only a worker of this release reads), so an
// entry of one-job messages stays version 4, byte for byte.
const (
	stateV1 = 1
	stateV2 = 2
	stateV3 = 3
	stateV4 = 4
	stateV5 = 5
)

// appendStateHeader appends an entry's version, fence, epoch, batch index
// (version 5 only) and count of held outcomes.
func appendStateHeader(b []byte, e Entry) []byte {
	if e.Index > 0 {
		b = append(b, stateV5)
	} else {
		b = append(b, stateV4)
	}
	b = binary.AppendUvarint(b, e.Fence)
	b = binary.BigEndian.AppendUint64(b, e.Epoch)
	if e.Index > 0 {
		b = binary.AppendUvarint(b, uint64(e.Index))
	}
	return binary.AppendUvarint(b, uint64(len(e.Recent)+1))
}

func encodeState(e Entry) []byte {
	// A guess for a window of IDs that share prefixes and of repeated
	// results (12 bytes an outcome); append grows it for others.
	n := 1 + 3*binary.MaxVarintLen64 + 8 + 12*len(e.Recent) + len(e.JobID) + len(e.Result) + len(e.Value)
	b := make([]byte, 0, n)
	b = appendStateHeader(b, e)
	var prevSeq uint64
	var prevID string
	var prevRes []byte
	prevShared, first := 0, true
	appendOne := func(seq uint64, id string, res []byte) {
		b = binary.AppendVarint(b, int64(seq-prevSeq))
		shared := sharedPrefix(id, prevID, prevShared)
		b = binary.AppendUvarint(b, uint64(shared))
		b = binary.AppendUvarint(b, uint64(len(id)-shared))
		b = append(b, id[shared:]...)
		if !first && bytes.Equal(res, prevRes) {
			b = append(b, 0)
		} else {
			b = binary.AppendUvarint(b, uint64(len(res))+1)
			b = append(b, res...)
		}
		prevSeq, prevID, prevRes, prevShared, first = seq, id, res, shared, false
	}
	for _, r := range e.Recent {
		appendOne(r.Seq, r.ID, r.Result)
	}
	appendOne(e.Seq, e.JobID, e.Result)
	return append(b, e.Value...)
}

// sharedPrefix returns the length of the prefix a and b share. Neighbouring
// IDs of a window usually share as much as the pair before them (guess):
// one comparison of that prefix, then byte by byte.
func sharedPrefix(a, b string, guess int) int {
	n := 0
	if guess <= len(a) && guess <= len(b) && a[:guess] == b[:guess] {
		n = guess
	}
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// Decode reads a state entry of any version; a malformed one is
// ErrBadState.
func Decode(b []byte) (Entry, error) {
	if len(b) > 0 {
		switch b[0] {
		case stateV4, stateV5:
			return decodeStateV4(b)
		case stateV3:
			return decodeStateV3(b)
		}
	}
	var e Entry
	if len(b) < 1+8+8+2 || (b[0] != stateV1 && b[0] != stateV2) {
		return e, core.ErrBadState
	}
	version := b[0]
	e.Seq = binary.BigEndian.Uint64(b[1:])
	e.Fence = binary.BigEndian.Uint64(b[9:])
	n := int(binary.BigEndian.Uint16(b[17:]))
	b = b[19:]
	if len(b) < n+4 {
		return e, core.ErrBadState
	}
	e.JobID = string(b[:n])
	b = b[n:]
	r := int(binary.BigEndian.Uint32(b))
	b = b[4:]
	if len(b) < r {
		return e, core.ErrBadState
	}
	if r > 0 {
		e.Result = append([]byte(nil), b[:r]...)
	}
	b = b[r:]
	if version == stateV2 {
		if len(b) < 2 {
			return e, core.ErrBadState
		}
		k := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for range k {
			if len(b) < 12 {
				return e, core.ErrBadState
			}
			seq := binary.BigEndian.Uint64(b)
			l := int(binary.BigEndian.Uint32(b[8:]))
			b = b[12:]
			if len(b) < l {
				return e, core.ErrBadState
			}
			// Version 2 kept no IDs for the earlier jobs of a write.
			e.Recent = append(e.Recent, AppliedResult{Seq: seq, Result: append([]byte(nil), b[:l]...)})
			b = b[l:]
		}
	}
	e.Value = append([]byte(nil), b...)
	return e, nil
}

func decodeStateV3(b []byte) (Entry, error) {
	var e Entry
	if len(b) < 1+8+8+2 {
		return e, core.ErrBadState
	}
	e.Fence = binary.BigEndian.Uint64(b[1:])
	e.Epoch = binary.BigEndian.Uint64(b[9:])
	k := int(binary.BigEndian.Uint16(b[17:]))
	b = b[19:]
	if k == 0 {
		return e, core.ErrBadState
	}
	held := make([]AppliedResult, k)
	for i := range held {
		if len(b) < 10 {
			return e, core.ErrBadState
		}
		held[i].Seq = binary.BigEndian.Uint64(b)
		n := int(binary.BigEndian.Uint16(b[8:]))
		b = b[10:]
		if len(b) < n+4 {
			return e, core.ErrBadState
		}
		held[i].ID = string(b[:n])
		r := int(binary.BigEndian.Uint32(b[n:]))
		b = b[n+4:]
		if len(b) < r {
			return e, core.ErrBadState
		}
		if r > 0 {
			held[i].Result = append([]byte(nil), b[:r]...)
		}
		b = b[r:]
	}
	last := held[k-1]
	e.Seq, e.JobID, e.Result = last.Seq, last.ID, last.Result
	if k > 1 {
		e.Recent = held[:k-1]
	}
	e.Value = append([]byte(nil), b...)
	return e, nil
}

func decodeStateV4(b []byte) (Entry, error) {
	var e Entry
	v5 := b[0] == stateV5
	b = b[1:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	fence, ok := uvarint()
	if !ok || len(b) < 8 {
		return e, core.ErrBadState
	}
	e.Fence = fence
	e.Epoch = binary.BigEndian.Uint64(b)
	b = b[8:]
	if v5 {
		index, ok := uvarint()
		if !ok || index == 0 || index > wire.MaxBatchJobs {
			return e, core.ErrBadState
		}
		e.Index = int(index)
	}
	k, ok := uvarint()
	// Every outcome takes at least 4 bytes: a count beyond that is corrupt
	// (and must not size an allocation).
	if !ok || k == 0 || k > uint64(len(b)/4) {
		return e, core.ErrBadState
	}
	held := make([]AppliedResult, k)
	var prevSeq uint64
	var prevID string
	var prevRes []byte
	for i := range held {
		d, n := binary.Varint(b)
		if n <= 0 {
			return e, core.ErrBadState
		}
		b = b[n:]
		shared, ok1 := uvarint()
		rest, ok2 := uvarint()
		if !ok1 || !ok2 || shared > uint64(len(prevID)) || rest > uint64(len(b)) {
			return e, core.ErrBadState
		}
		id := prevID[:shared] + string(b[:rest])
		b = b[rest:]
		r, ok := uvarint()
		if !ok || (r == 0 && i == 0) || r > uint64(len(b))+1 {
			return e, core.ErrBadState
		}
		var res []byte
		switch {
		case r == 0:
			res = bytes.Clone(prevRes)
		case r > 1:
			res = append([]byte(nil), b[:r-1]...)
		}
		b = b[max(r, 1)-1:]
		seq := prevSeq + uint64(d)
		held[i] = AppliedResult{Seq: seq, ID: id, Result: res}
		prevSeq, prevID, prevRes = seq, id, res
	}
	last := held[k-1]
	e.Seq, e.JobID, e.Result = last.Seq, last.ID, last.Result
	if k > 1 {
		e.Recent = held[:k-1]
	}
	e.Value = append([]byte(nil), b...)
	return e, nil
}
