package jetstream

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStaleFence is returned by State.Apply when the key was last written
// under a newer fence than the job's: a newer owner of the partition exists,
// so this worker must not write, reply or ack.
var ErrStaleFence = errors.New("keylane: stale fence: a newer owner has written this key")

var errTooManyWriters = errors.New("too many concurrent writers")

// ErrBadState is returned when a state entry cannot be decoded.
var ErrBadState = errors.New("keylane: malformed state entry")

// State keeps one value per resource key in a KV bucket and applies updates
// with exactly-once effect. Each entry records, beside the value, the stream
// sequence and fence of the job that wrote it and that job's result. Apply
// writes with compare-and-set on the entry's revision, so:
//
//   - a job whose sequence is not above the stored one was already applied
//     (a redelivery): Apply returns the stored result and writes nothing;
//   - a job whose fence is below the stored one comes from a stale owner:
//     Apply returns ErrStaleFence and writes nothing;
//   - a concurrent writer makes the CAS fail: Apply re-reads and decides
//     again.
//
// Since jobs of one key run one at a time on the partition owner, the owner
// caches the last revision it wrote and usually needs one round trip per
// job. State is safe for concurrent use.
type State struct {
	kv    jetstream.KeyValue
	mu    sync.Mutex
	cache map[string]cachedEntry
}

type cachedEntry struct {
	rev   uint64
	fence uint64
	entry StateEntry
}

const maxCached = 1 << 16

// NewState returns a State on kv (usually Topology.State).
func NewState(kv jetstream.KeyValue) *State {
	return &State{kv: kv, cache: map[string]cachedEntry{}}
}

// StateEntry is a decoded state entry.
type StateEntry struct {
	// Value is the application's value; nil for a key never written.
	Value []byte
	// Seq and Fence are those of the job that wrote the entry.
	Seq, Fence uint64
	// JobID and Result are the writing job's ID and result.
	JobID  string
	Result []byte
	// Earlier holds the results of the other jobs applied by the same
	// write, when a worker group-committed several jobs of the key (see
	// Reducer), in stream order. Result belongs to the last of them.
	Earlier []AppliedResult
}

// AppliedResult is the result of one group-committed job.
type AppliedResult struct {
	Seq    uint64
	Result []byte
}

// ResultOf returns the result stored for the job at stream sequence seq,
// if the entry's write applied it.
func (e StateEntry) ResultOf(seq uint64) ([]byte, bool) {
	if seq == e.Seq {
		return e.Result, true
	}
	for _, r := range e.Earlier {
		if r.Seq == seq {
			return r.Result, true
		}
	}
	return nil, false
}

// UpdateFunc computes a key's next value and the job's result from the
// current value (nil if none). Returning an error writes nothing.
type UpdateFunc func(current []byte) (next, result []byte, err error)

// Apply runs fn against the key's current value and stores its output with
// compare-and-set, together with job.Seq and job.Fence. It returns fn's
// result, or the stored result when the job had already been applied.
func (s *State) Apply(ctx context.Context, job Job, fn UpdateFunc) ([]byte, error) {
	k := StateKey(job.Key)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cur, rev, err := s.current(ctx, k, job.Fence, attempt > 0)
		if err != nil {
			return nil, err
		}
		if rev != 0 && cur.Fence > job.Fence {
			return nil, fmt.Errorf("%w (job fence %d, stored fence %d)", ErrStaleFence, job.Fence, cur.Fence)
		}
		if rev != 0 && cur.Seq >= job.Seq {
			// Applied already; a job before the stored write's group has
			// its result no longer.
			res, _ := cur.ResultOf(job.Seq)
			return res, nil
		}
		next, result, err := fn(cur.Value)
		if err != nil {
			return nil, err
		}
		e := StateEntry{Value: next, Seq: job.Seq, Fence: job.Fence, JobID: job.ID, Result: result}
		// The worker cancels ctx the moment its lease is no longer trusted;
		// check as late as possible before writing.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var newRev uint64
		if rev == 0 {
			newRev, err = s.kv.Create(ctx, k, encodeState(e))
		} else {
			newRev, err = s.kv.Update(ctx, k, encodeState(e), rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			s.forget(k)
			if attempt > 8 {
				return nil, fmt.Errorf("keylane: state %q: %w: %w", job.Key, errTooManyWriters, err)
			}
			continue
		}
		if err != nil {
			// Unknown outcome: drop the cache so the next attempt re-reads.
			s.forget(k)
			return nil, fmt.Errorf("keylane: state %q: %w", job.Key, err)
		}
		s.remember(k, cachedEntry{rev: newRev, fence: job.Fence, entry: e})
		return result, nil
	}
}

// Get returns the key's current entry; a key never written returns a zero
// StateEntry and no error.
func (s *State) Get(ctx context.Context, key string) (StateEntry, error) {
	e, _, err := s.read(ctx, StateKey(key))
	return e, err
}

func (s *State) current(ctx context.Context, k string, fence uint64, reread bool) (StateEntry, uint64, error) {
	if !reread {
		s.mu.Lock()
		c, ok := s.cache[k]
		s.mu.Unlock()
		// Only the owner of this tenure may trust its cache.
		if ok && c.fence == fence {
			return c.entry, c.rev, nil
		}
	}
	return s.read(ctx, k)
}

func (s *State) read(ctx context.Context, k string) (StateEntry, uint64, error) {
	kve, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return StateEntry{}, 0, nil
	}
	if err != nil {
		return StateEntry{}, 0, err
	}
	e, err := decodeState(kve.Value())
	if err != nil {
		return StateEntry{}, 0, err
	}
	return e, kve.Revision(), nil
}

func (s *State) remember(k string, c cachedEntry) {
	s.mu.Lock()
	if len(s.cache) >= maxCached {
		clear(s.cache)
	}
	s.cache[k] = c
	s.mu.Unlock()
}

func (s *State) forget(k string) {
	s.mu.Lock()
	delete(s.cache, k)
	s.mu.Unlock()
}

// StateKey is the KV key that holds a resource key's state: the key in
// unpadded base64url, since KV keys allow only a few characters.
func StateKey(key string) string {
	return "k." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// Entry encoding, big-endian: version (1 byte), seq (8), fence (8), job ID
// length (2) and job ID, result length (4) and result, then, in version 2
// only, the count of earlier results (2) and each as seq (8), length (4)
// and bytes; the rest is the value. Version 1 entries (no earlier results)
// are still read.
const (
	stateV1 = 1
	stateV2 = 2
)

func encodeState(e StateEntry) []byte {
	n := 1 + 8 + 8 + 2 + len(e.JobID) + 4 + len(e.Result) + 2 + len(e.Value)
	for _, r := range e.Earlier {
		n += 12 + len(r.Result)
	}
	b := make([]byte, 0, n)
	b = append(b, stateV2)
	b = binary.BigEndian.AppendUint64(b, e.Seq)
	b = binary.BigEndian.AppendUint64(b, e.Fence)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.JobID)))
	b = append(b, e.JobID...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.Result)))
	b = append(b, e.Result...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Earlier)))
	for _, r := range e.Earlier {
		b = binary.BigEndian.AppendUint64(b, r.Seq)
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Result)))
		b = append(b, r.Result...)
	}
	return append(b, e.Value...)
}

func decodeState(b []byte) (StateEntry, error) {
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
		if k > 0 {
			e.Earlier = make([]AppliedResult, k)
		}
		for i := range k {
			if len(b) < 12 {
				return e, ErrBadState
			}
			e.Earlier[i].Seq = binary.BigEndian.Uint64(b)
			l := int(binary.BigEndian.Uint32(b[8:]))
			b = b[12:]
			if len(b) < l {
				return e, ErrBadState
			}
			e.Earlier[i].Result = append([]byte(nil), b[:l]...)
			b = b[l:]
		}
	}
	e.Value = append([]byte(nil), b...)
	return e, nil
}

// Group-commit bounds: a group stops growing once its reducers ran this
// long (so the first job's reply is not held up by a slow reducer) or its
// results take this many bytes (an entry must fit in one message).
const (
	groupTime  = 5 * time.Millisecond
	groupBytes = 64 << 10
)

// group applies consecutive jobs of one key, in stream order, against the
// key's current state and stores the outcome with one compare-and-set: a
// group commit. Jobs the stored entry already covers are settled from it
// without running. It returns n, how many of jobs are settled (their
// results in out[:n]); when n < len(jobs), rerr is jobs[n]'s reduce error,
// or nil if the group stopped at its time or size bound. A write error
// (werr) settles nothing: the write may or may not have landed, or
// another writer got in first. group makes one attempt; the caller decides
// how to retry. All jobs carry the same fence.
func (s *State) group(ctx context.Context, jobs []Job, out [][]byte, reduce func(i int, cur []byte) (next, result []byte, err error)) (n int, rerr, werr error) {
	job0 := jobs[0]
	k := StateKey(job0.Key)
	cur, rev, err := s.current(ctx, k, job0.Fence, false)
	if err != nil {
		return 0, nil, err
	}
	if rev != 0 && cur.Fence > job0.Fence {
		return 0, nil, fmt.Errorf("%w (job fence %d, stored fence %d)", ErrStaleFence, job0.Fence, cur.Fence)
	}
	value, last, size := cur.Value, -1, 0
	var earlier []AppliedResult
	start := time.Now()
	for ; n < len(jobs); n++ {
		j := jobs[n]
		if rev != 0 && j.Seq <= cur.Seq {
			out[n], _ = cur.ResultOf(j.Seq)
			continue
		}
		if last >= 0 && (size > groupBytes || time.Since(start) > groupTime) {
			break
		}
		next, res, err := reduce(n, value)
		if err != nil {
			rerr = err
			break
		}
		if last >= 0 {
			earlier = append(earlier, AppliedResult{Seq: jobs[last].Seq, Result: out[last]})
		}
		value, out[n], last = next, res, n
		size += 12 + len(res)
	}
	if last < 0 {
		return n, rerr, nil
	}
	// The worker cancels ctx the moment its lease is no longer trusted;
	// check as late as possible before writing.
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	e := StateEntry{Value: value, Seq: jobs[last].Seq, Fence: job0.Fence, JobID: jobs[last].ID, Result: out[last], Earlier: earlier}
	var newRev uint64
	if rev == 0 {
		newRev, err = s.kv.Create(ctx, k, encodeState(e))
	} else {
		newRev, err = s.kv.Update(ctx, k, encodeState(e), rev)
	}
	if err != nil {
		s.forget(k)
		return 0, nil, fmt.Errorf("keylane: state %q: %w", job0.Key, err)
	}
	s.remember(k, cachedEntry{rev: newRev, fence: job0.Fence, entry: e})
	return n, rerr, nil
}
