package keylane

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// StateKey is the KV key that holds a resource key's state: the key in
// unpadded base64url, since KV keys allow only a few characters.
func StateKey(key string) string {
	return "k." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// keyOf is the resource key of a state bucket key (StateKey's inverse).
func keyOf(k string) string {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(k, "k."))
	if err != nil {
		return k
	}
	return string(b)
}

// Entry encoding, big-endian. Version 3: version (1 byte), fence (8),
// epoch (8), the count of held outcomes (2) and each as seq (8), ID length
// (2) and ID, result length (4) and result, the last applied job last; the
// rest is the value. Versions 1 and 2 (seq, fence, job ID, result, and in 2
// the earlier results of the same write) are still read.
const (
	stateV1 = 1
	stateV2 = 2
	stateV3 = 3
)

func encodeState(e StateEntry) []byte {
	n := 1 + 8 + 8 + 2 + 14 + len(e.JobID) + len(e.Result) + len(e.Value)
	for _, r := range e.Recent {
		n += 14 + len(r.ID) + len(r.Result)
	}
	b := make([]byte, 0, n)
	b = append(b, stateV3)
	b = binary.BigEndian.AppendUint64(b, e.Fence)
	b = binary.BigEndian.AppendUint64(b, e.Epoch)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Recent)+1))
	appendOne := func(seq uint64, id string, res []byte) {
		b = binary.BigEndian.AppendUint64(b, seq)
		b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
		b = append(b, id...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(res)))
		b = append(b, res...)
	}
	for _, r := range e.Recent {
		appendOne(r.Seq, r.ID, r.Result)
	}
	appendOne(e.Seq, e.JobID, e.Result)
	return append(b, e.Value...)
}

func decodeState(b []byte) (StateEntry, error) {
	if len(b) > 0 && b[0] == stateV3 {
		return decodeStateV3(b)
	}
	var e StateEntry
	if len(b) < 1+8+8+2 || (b[0] != stateV1 && b[0] != stateV2) {
		return e, ErrBadState
	}
	version := b[0]
	e.Seq = binary.BigEndian.Uint64(b[1:])
	e.Fence = binary.BigEndian.Uint64(b[9:])
	n := int(binary.BigEndian.Uint16(b[17:]))
	b = b[19:]
	if len(b) < n+4 {
		return e, ErrBadState
	}
	e.JobID = string(b[:n])
	b = b[n:]
	r := int(binary.BigEndian.Uint32(b))
	b = b[4:]
	if len(b) < r {
		return e, ErrBadState
	}
	if r > 0 {
		e.Result = append([]byte(nil), b[:r]...)
	}
	b = b[r:]
	if version == stateV2 {
		if len(b) < 2 {
			return e, ErrBadState
		}
		k := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for range k {
			if len(b) < 12 {
				return e, ErrBadState
			}
			seq := binary.BigEndian.Uint64(b)
			l := int(binary.BigEndian.Uint32(b[8:]))
			b = b[12:]
			if len(b) < l {
				return e, ErrBadState
			}
			// Version 2 kept no IDs for the earlier jobs of a write.
			e.Recent = append(e.Recent, AppliedResult{Seq: seq, Result: append([]byte(nil), b[:l]...)})
			b = b[l:]
		}
	}
	e.Value = append([]byte(nil), b...)
	return e, nil
}

func decodeStateV3(b []byte) (StateEntry, error) {
	var e StateEntry
	if len(b) < 1+8+8+2 {
		return e, ErrBadState
	}
	e.Fence = binary.BigEndian.Uint64(b[1:])
	e.Epoch = binary.BigEndian.Uint64(b[9:])
	k := int(binary.BigEndian.Uint16(b[17:]))
	b = b[19:]
	if k == 0 {
		return e, ErrBadState
	}
	held := make([]AppliedResult, k)
	for i := range held {
		if len(b) < 10 {
			return e, ErrBadState
		}
		held[i].Seq = binary.BigEndian.Uint64(b)
		n := int(binary.BigEndian.Uint16(b[8:]))
		b = b[10:]
		if len(b) < n+4 {
			return e, ErrBadState
		}
		held[i].ID = string(b[:n])
		r := int(binary.BigEndian.Uint32(b[n:]))
		b = b[n+4:]
		if len(b) < r {
			return e, ErrBadState
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
