package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go/jetstream"
)

// The group commit: a tenure reads a key once, applies a group of its jobs,
// and stores the outcome with one compare-and-set (cas.go), caching the
// entry for the next group. Store.Apply uses the same read and write.

// next builds the entry that follows cur once jobs (in stream order, all
// under fence) applied with results: the new value, the last job's
// sequence and outcome, and a bounded window of earlier outcomes. It
// extends cur's held log when it may (heldlog.go), else copies.
func (s *Store) next(cur Entry, value []byte, fence uint64, jobs []core.Job, results [][]byte) Entry {
	last := len(jobs) - 1
	e := Entry{Value: value, Seq: jobs[last].Seq, Index: jobs[last].Index(), Fence: fence, Epoch: s.epochFor(jobs[last].Partition), JobID: jobs[last].ID, Result: results[last]}
	// Outcomes from an adopted stream keep their IDs; those named after a
	// sequence of that stream are meaningless now.
	adopted := s.epochRelation(cur, jobs[last].Partition) == epochAdopted
	if !adopted {
		if e, ok := s.nextHeld(cur, e, jobs, results); ok {
			return e
		}
	}
	keep := s.keep
	recent := make([]AppliedResult, 0, heldRoom(min(keep, len(cur.Recent)+len(jobs))))
	for _, r := range cur.Recent {
		if !adopted || !strings.HasPrefix(r.ID, SyntheticIDPrefix) {
			recent = append(recent, r)
		}
	}
	if cur.JobID != "" && (!adopted || !strings.HasPrefix(cur.JobID, SyntheticIDPrefix)) {
		recent = append(recent, AppliedResult{Seq: cur.Seq, ID: cur.JobID, Result: cur.Result})
	}
	for i := range last {
		recent = append(recent, AppliedResult{Seq: jobs[i].Seq, ID: jobs[i].ID, Result: results[i]})
	}
	// Trim from the oldest: at most keep outcomes and heldBytes of them.
	size := 0
	from := len(recent)
	for from > 0 && len(recent)-from < keep-1 {
		r := recent[from-1]
		size += heldSize(r)
		if size > HeldBytes {
			break
		}
		from--
	}
	e.Recent = recent[from:]
	return withHeldLog(e)
}

// write stores e over revision rev (0: the key is new) with compare-and-set
// and caches it for this tenure; p is the partition whose group it is, for
// the writes coalesced per partition (batch.go), or -1. A failed write drops the cache: its
// outcome may be unknown, so the next attempt re-reads. An entry too large
// for one message has its held window shrunk to fit (fit), keeping the
// own outcomes at the end of e.Recent: those of the group being written.
func (s *Store) write(ctx context.Context, p int, k string, rev uint64, e Entry, own int) error {
	kv, err := s.bucket()
	if err != nil {
		return err
	}
	b := encodeEntry(e)
	if limit := s.maxEntry(); limit > 0 && len(b) > limit {
		if e, b, err = fit(k, e, own, limit); err != nil {
			s.forget(k)
			return err
		}
	}
	newRev, err := s.put(ctx, kv, p, k, rev, b)
	if err != nil {
		s.forget(k)
		return err
	}
	s.remember(k, cachedEntry{rev: newRev, fence: e.Fence, entry: e})
	return nil
}

func (s *Store) current(ctx context.Context, k string, fence uint64, reread bool) (Entry, uint64, error) {
	if !reread {
		s.mu.Lock()
		c, ok := s.cache[k]
		s.mu.Unlock()
		// Only the owner of this tenure may trust its cache.
		if ok && c.fence == fence {
			return c.entry, c.rev, nil
		}
	}
	return s.Read(ctx, k)
}

// Read returns the entry of bucket key k (Key of a resource key) and its
// revision; a key never written is a zero Entry at revision 0.
func (s *Store) Read(ctx context.Context, k string) (Entry, uint64, error) {
	kv, err := s.bucket()
	if err != nil {
		return Entry{}, 0, err
	}
	kve, err := kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Entry{}, 0, nil
	}
	if err != nil {
		return Entry{}, 0, &core.StateError{Key: keyOf(k), Err: err}
	}
	e, err := Decode(kve.Value())
	if err != nil {
		return Entry{}, 0, err
	}
	return e, kve.Revision(), nil
}

func (s *Store) remember(k string, c cachedEntry) {
	s.mu.Lock()
	if len(s.cache) >= maxCached {
		clear(s.cache)
	}
	s.cache[k] = c
	s.mu.Unlock()
}

func (s *Store) forget(k string) {
	s.mu.Lock()
	delete(s.cache, k)
	s.mu.Unlock()
}

// Group-commit bounds: a group stops growing once its reducers ran this
// long (so the first job's reply is not held up by a slow reducer) or its
// results take this many bytes (an entry must fit in one message).
const (
	groupTime  = 5 * time.Millisecond
	groupBytes = 64 << 10
)

// Group applies consecutive jobs of one key, in stream order, against the
// key's current state and stores the outcome with one compare-and-set: a
// group commit. Jobs whose outcome the entry holds are settled from it
// without running. It returns n, how many of jobs are settled (their
// results in out[:n]); when n < len(jobs), rerr is why jobs[n] did not
// run: its reduce error, or ErrGap or ErrEpoch from the entry; nil if the
// group stopped at its time or size bound. A write error (werr) settles
// nothing: the write may or may not have landed, or another writer got in
// first. Group makes one attempt; the caller decides how to retry. All
// jobs carry the same fence.
func (s *Store) Group(ctx context.Context, jobs []core.Job, out [][]byte, reduce func(i int, cur []byte) (next, result []byte, err error)) (n int, rerr, werr error) {
	job0 := jobs[0]
	k := Key(job0.Key)
	cur, rev, err := s.current(ctx, k, job0.Fence, false)
	if err != nil {
		return 0, nil, err
	}
	if rev != 0 && cur.Fence > job0.Fence {
		return 0, nil, fmt.Errorf("%w (job fence %d, stored fence %d)", core.ErrStaleFence, job0.Fence, cur.Fence)
	}
	value, size := cur.Value, 0
	var ran []core.Job
	var results [][]byte
	start := time.Now()
	for ; n < len(jobs); n++ {
		j := jobs[n]
		res, applied, err := s.check(cur, rev, j)
		if err == nil && !applied {
			// Jobs settled in this group count as held too.
			for i, r := range ran {
				if r.ID == j.ID {
					res, applied = results[i], true
				}
			}
		}
		if err != nil {
			rerr = err
			break
		}
		if applied {
			out[n] = res
			continue
		}
		if len(ran) > 0 && (size > groupBytes || time.Since(start) > groupTime) {
			break
		}
		next, res, err := reduce(n, value)
		if err != nil {
			rerr = err
			break
		}
		value, out[n] = next, res
		ran, results = append(ran, j), append(results, res)
		size += heldSize(AppliedResult{ID: j.ID, Result: res})
	}
	if len(ran) == 0 {
		return n, rerr, nil
	}
	// The worker cancels ctx the moment its lease is no longer trusted;
	// check as late as possible before writing.
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	if err := s.write(ctx, job0.Partition, k, rev, s.next(cur, value, job0.Fence, ran, results), len(ran)-1); err != nil {
		if Conflict(err) {
			return 0, nil, fmt.Errorf("keylane: state %q: %w", job0.Key, err)
		}
		return 0, nil, writeError(job0.Key, err)
	}
	return n, rerr, nil
}

// SyntheticIDPrefix names jobs published without a job ID after their
// stream sequence.
const SyntheticIDPrefix = "seq-"

// Cached returns the revision s cached for bucket key k, if any: what the
// owner's next group of k's jobs writes over without reading (tests).
func (s *Store) Cached(k string) (rev uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cache[k]
	return c.rev, ok
}
