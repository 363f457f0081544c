package statestore

import (
	"bytes"
	"encoding/binary"
	"sync"

	"github.com/keylane/keylane/internal/core"
)

// The held window, kept between group commits. A hot key's entry holds the
// outcomes of its last HeldJobs jobs and every group commit rewrites all of
// them; building, encoding and searching that window afresh made each group
// cost what the window does (1024 outcomes for a group of one). The owner
// keeps instead, with the key's cached entry, a heldLog: the window's
// outcomes in one growing array, each outcome's version 4 encoding relative
// to the outcome before it, and (once a job was looked up) an index from
// job ID to position. A group commit appends its outcomes and their
// encodings and moves the window's start past the oldest ones it drops;
// the entry's bytes are then the header, the first outcome encoded on its
// own (version 4 encodes the first outcome from zero: a sequence delta
// from 0, the whole ID, the whole result), the kept encodings of the
// others as they are, and the value. Dropping the oldest outcome changes
// no other outcome's encoding, since each depends on its predecessor only
// (sharedPrefix finds the longest shared prefix whatever its guess). So
// the bytes are those encodeState writes for the same entry, byte for
// byte (TestHeldLogMatchesFullPath): a worker of the previous build reads
// them as it always did. Only the copy of the window's bytes into the
// entry still grows with the window; the entry is one message.
//
// A heldLog is extended by one successor of each entry only: the head. An
// entry whose log moved on (another write was built from it, or from a
// concurrent Apply's copy) is read and extended the full way, by scanning
// and by next's copy, as before. Positions below the array's length are
// never written again, so the outcomes an older entry sees stay as they
// were; a log that runs out of room moves the window to a new array.

// heldLog is the incremental form of one key's held window. Its fields are
// guarded by mu; the elements of held and rel below their lengths never
// change.
type heldLog struct {
	mu    sync.Mutex
	head  *heldView       // the view that may be extended and searched by index
	base  int             // absolute position of held[0]
	held  []AppliedResult // outcomes, oldest first
	ends  []int           // ends[i]: where held[i]'s encoding relative to held[i-1] ends in rel
	rel   []byte          // the relative encodings, back to back
	index map[string]int  // job ID -> absolute position of its newest outcome; nil until a look-up
}

// heldView is one entry's window in a heldLog: the outcomes at absolute
// positions lo .. lo+len(Recent) (the last is the entry's JobID).
type heldView struct {
	log   *heldLog
	lo    int
	rel   []byte // the encodings of the view's outcomes after its first
	bytes int    // Recent's size as next's trim counts it
}

// heldSize is what one outcome counts towards HeldBytes.
func heldSize(r AppliedResult) int { return 16 + len(r.ID) + len(r.Result) }

// appendHeldOutcome appends r's version 4 encoding (codec.go) after
// prev, or as the first outcome when prev is nil; encodeState's appendOne
// writes the same bytes.
func appendHeldOutcome(b []byte, prev *AppliedResult, r AppliedResult) []byte {
	var prevSeq uint64
	var prevID string
	if prev != nil {
		prevSeq, prevID = prev.Seq, prev.ID
	}
	b = binary.AppendVarint(b, int64(r.Seq-prevSeq))
	shared := sharedPrefix(r.ID, prevID, 0)
	b = binary.AppendUvarint(b, uint64(shared))
	b = binary.AppendUvarint(b, uint64(len(r.ID)-shared))
	b = append(b, r.ID[shared:]...)
	if prev != nil && bytes.Equal(r.Result, prev.Result) {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Result))+1)
	return append(b, r.Result...)
}

// heldRoom is the capacity next's full path gives a window of n outcomes,
// so that its log can take the array over with room to grow (compact).
func heldRoom(n int) int { return n + n/4 + 16 }

// withHeldLog gives e (built by next's full path, which made e.Recent's
// array and nothing else holds it) a fresh log holding its window; the
// log takes e.Recent's array when it has room for the last outcome.
func withHeldLog(e Entry) Entry {
	k := len(e.Recent) + 1
	l := &heldLog{held: e.Recent}
	if cap(e.Recent) < k {
		l.held = make([]AppliedResult, len(e.Recent), heldRoom(k))
		copy(l.held, e.Recent)
	}
	l.held = append(l.held, AppliedResult{Seq: e.Seq, ID: e.JobID, Result: e.Result})
	l.ends = append(make([]int, 0, cap(l.held)), 0)
	l.rel = make([]byte, 0, 16*cap(l.held))
	v := &heldView{log: l}
	for i := 1; i < k; i++ {
		l.rel = appendHeldOutcome(l.rel, &l.held[i-1], l.held[i])
		l.ends = append(l.ends, len(l.rel))
	}
	for _, r := range e.Recent {
		v.bytes += heldSize(r)
	}
	v.rel = l.rel
	l.head = v
	e.Recent, e.view = l.held[:k-1:k-1], v
	return e
}

// nextHeld is next's incremental path: it extends cur's log with the
// group's outcomes and trims the window to keep outcomes and HeldBytes,
// as next's full path does. ok is false when cur has no log it may extend
// (read from the bucket, or its log moved on) or the full path must decide
// (cur holds no last job ID: next does not hold that outcome again).
func (s *Store) nextHeld(cur Entry, e Entry, jobs []core.Job, results [][]byte) (Entry, bool) {
	v := cur.view
	if v == nil || cur.JobID == "" {
		return e, false
	}
	l := v.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head != v {
		return e, false
	}
	hi := v.lo + len(cur.Recent) + 1 // one past cur's last outcome
	if hi-l.base != len(l.held) {
		return e, false // cannot happen while v is the head; never guess
	}
	if len(l.held)+len(jobs) > cap(l.held) {
		l.compact(v.lo, len(jobs))
	}
	for i, j := range jobs {
		p := len(l.held)
		l.held = append(l.held, AppliedResult{Seq: j.Seq, ID: j.ID, Result: results[i]})
		l.rel = appendHeldOutcome(l.rel, &l.held[p-1], l.held[p])
		l.ends = append(l.ends, len(l.rel))
		if l.index != nil && j.ID != "" {
			l.index[j.ID] = l.base + p
		}
	}
	// The window's outcomes before the new last: cur's, cur's last and the
	// group's but its last; drop the oldest while too many or too large.
	lo, size := v.lo, v.bytes+heldSize(l.held[hi-1-l.base])
	for i := range len(jobs) - 1 {
		size += heldSize(l.held[hi+i-l.base])
	}
	last := l.base + len(l.held) - 1
	for lo < last && (last-lo > s.keep-1 || size > HeldBytes) {
		r := l.held[lo-l.base]
		size -= heldSize(r)
		if l.index != nil && r.ID != "" && l.index[r.ID] == lo {
			delete(l.index, r.ID)
		}
		lo++
	}
	n := &heldView{log: l, lo: lo, bytes: size, rel: l.rel[l.ends[lo-l.base]:]}
	l.head = n
	e.Recent, e.view = l.held[lo-l.base:last-l.base:last-l.base], n
	return e, true
}

// compact moves the outcomes from absolute position lo on into new arrays
// with room for a quarter more of them and twice more outcomes, so a hot
// key moves its window once every quarter window (a copy, no encoding)
// and keeps a quarter more than today's window in memory. The old arrays
// stay as older entries see them.
func (l *heldLog) compact(lo, more int) {
	from := lo - l.base
	live := len(l.held) - from
	held := make([]AppliedResult, live, live+live/4+2*more+16)
	copy(held, l.held[from:])
	cut := l.ends[from]
	ends := make([]int, live, cap(held))
	for i, end := range l.ends[from:] {
		ends[i] = end - cut
	}
	rel := make([]byte, len(l.rel)-cut, cap(held)*(len(l.rel)-cut)/live+64*more)
	copy(rel, l.rel[cut:])
	l.held, l.ends, l.rel, l.base = held, ends, rel, lo
}

// lookup looks id up by index when v is its log's head. ok is false when it
// cannot say (v is not the head): the caller scans.
func (v *heldView) lookup(e Entry, id string) (res []byte, found, ok bool) {
	l := v.log
	l.mu.Lock()
	if l.head != v {
		l.mu.Unlock()
		return nil, false, false
	}
	if l.index == nil {
		l.index = make(map[string]int, len(e.Recent)+64)
		for i, r := range e.Recent {
			if r.ID != "" {
				l.index[r.ID] = v.lo + i
			}
		}
		if e.JobID != "" {
			l.index[e.JobID] = v.lo + len(e.Recent)
		}
	}
	p, in := l.index[id]
	l.mu.Unlock()
	switch i := p - v.lo; {
	case !in:
		return nil, false, true
	case i == len(e.Recent) && e.JobID == id:
		return e.Result, true, true
	case i >= 0 && i < len(e.Recent) && e.Recent[i].ID == id:
		return e.Recent[i].Result, true, true
	}
	return nil, false, false // an index out of step: scan
}

// encodeEntry is encodeState for an entry with a log: the header, the
// first outcome on its own, the kept encodings of the rest and the value.
func encodeEntry(e Entry) []byte {
	v := e.view
	if v == nil {
		return encodeState(e)
	}
	first := AppliedResult{Seq: e.Seq, ID: e.JobID, Result: e.Result}
	if len(e.Recent) > 0 {
		first = e.Recent[0]
	}
	n := 1 + 8 + 6*binary.MaxVarintLen64 + len(first.ID) + len(first.Result) + len(v.rel) + len(e.Value)
	b := make([]byte, 0, n)
	b = appendStateHeader(b, e)
	b = appendHeldOutcome(b, nil, first)
	b = append(b, v.rel...)
	return append(b, e.Value...)
}
