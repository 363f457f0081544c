package statestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Store keeps one value per resource key in a KV bucket and applies updates
// with exactly-once effect. Each entry records, beside the value, the
// fence and stream sequence of the last job that wrote it, the jobs
// stream's epoch, and the outcomes (job ID and result) of the key's most
// recent jobs. Apply writes with compare-and-set on the entry's revision,
// so:
//
//   - a job whose outcome the entry holds was applied already (a
//     redelivery, or the same job ID submitted again after the server's
//     duplicate window): Apply returns the held result and writes nothing;
//   - a job at or below the stored sequence whose outcome is not held never
//     ran while later jobs of its key did: Apply returns ErrGap and writes
//     nothing (the worker re-synchronises its partition; see doc.go);
//   - a job whose fence is below the stored one comes from a stale owner:
//     Apply returns ErrStaleFence and writes nothing;
//   - an entry written under another jobs stream (re-created) gets ErrEpoch
//     until the stream adopts the old epoch (see Adopt);
//   - a concurrent writer makes the CAS fail: Apply re-reads and decides
//     again.
//
// The held outcomes are a window of the key's last HeldJobs jobs, at most
// HeldBytes of IDs and results; it covers every job of the key a partition
// can hold unacknowledged (MaxInFlight), so every redelivery finds its own
// outcome. An entry must also fit in one message: a Store that knows its
// connection (Config.Conn) shrinks the window, oldest first, to fit the
// server's max_payload, and refuses with ErrStateTooLarge (permanent) an
// entry that cannot fit with only the outcomes it writes (jetstream/doc.go,
// "Outcomes are held").
//
// Since jobs of one key run one at a time on the partition owner, the owner
// caches the last revision it wrote and usually needs one round trip per
// job. Store is safe for concurrent use.
type Store struct {
	kv      jetstream.KeyValue
	epochOf func(p int) uint64 // the epoch of partition p's jobs stream shard; nil: not checked
	adopted []uint64           // epochs of earlier streams this one took over
	keep    int                // outcomes held per key
	mu      sync.Mutex
	cache   map[string]cachedEntry

	// conn is the connection the bucket writes on, whose server's
	// max_payload bounds an entry; nil: not known, not checked. Guarded
	// by mu.
	conn *nats.Conn
	// batched coalesces the writes of each partition's concurrent
	// groups (batch.go); nil: each write alone. Guarded by mu.
	batched *stateBatches
}

// Config is what a Store works on: a namespace's state bucket and what
// ties its entries to the jobs streams. Bind replaces all of it but Keep.
type Config struct {
	// KV is the state bucket; nil until bound: reads and writes return
	// ErrNotStarted.
	KV jetstream.KeyValue
	// EpochOf returns the epoch of the jobs stream shard that holds
	// partition p (the root's Topology.EpochOf); nil: epochs are not
	// checked.
	EpochOf func(p int) uint64
	// Adopted are the epochs of earlier jobs streams this one took over
	// (the namespace's metadata).
	Adopted []uint64
	// Conn is the connection KV writes on, whose server's max_payload
	// bounds an entry; nil: not known, not checked.
	Conn *nats.Conn
	// Keep is how many outcomes an entry holds per key; 0: HeldJobs.
	Keep int
}

// Bounds of the outcomes a state entry holds: the last HeldJobs jobs of the
// key, and no more than HeldBytes of their IDs and results.
const (
	HeldJobs  = 1024
	HeldBytes = 256 << 10
)

type cachedEntry struct {
	rev   uint64
	fence uint64
	entry Entry
}

const maxCached = 1 << 16

// New returns a Store on cfg.
func New(cfg Config) *Store {
	keep := cfg.Keep
	if keep <= 0 {
		keep = HeldJobs
	}
	return &Store{kv: cfg.KV, epochOf: cfg.EpochOf, adopted: cfg.Adopted, conn: cfg.Conn, keep: keep, cache: map[string]cachedEntry{}}
}

// Bind points s at a namespace's state bucket and epochs (Worker.Start,
// and again when a repartition replaced the jobs streams), and forgets
// what it cached. cfg.Keep is ignored.
func (s *Store) Bind(cfg Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv, s.epochOf, s.adopted = cfg.KV, cfg.EpochOf, cfg.Adopted
	s.conn = cfg.Conn
	clear(s.cache)
}

// bucket returns the state bucket, or ErrNotStarted for a worker's State
// before its Start.
func (s *Store) bucket() (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv == nil {
		return nil, core.ErrNotStarted
	}
	return s.kv, nil
}

// Entry is a decoded state entry.
type Entry struct {
	// Value is the application's value; nil for a key never written.
	Value []byte
	// Seq and Fence are those of the last job applied to the key.
	Seq, Fence uint64
	// Index is the last applied job's place in its batch message (jobs of
	// one batch share Seq; see "Batches on the wire"), 0 for a one-job
	// message: (Seq, Index) is how far the key's jobs applied.
	Index int
	// Epoch identifies the jobs stream Seq belongs to (see Topology.Epoch);
	// zero in entries written before keylane recorded it.
	Epoch uint64
	// JobID and Result are the last applied job's ID and result.
	JobID  string
	Result []byte
	// Recent holds the outcomes of the jobs applied before the last one,
	// oldest first: a bounded window (see Store) of the key's history that
	// lets a redelivered or retried job be answered with its own result.
	Recent []AppliedResult

	view *heldView // the owner's incremental form of the window; nil when decoded
}

// AppliedResult is the outcome of one applied job.
type AppliedResult struct {
	Seq    uint64
	ID     string
	Result []byte
}

// Held returns the result of the job with the given ID if the entry holds
// its outcome: the job was applied. Job IDs are unique per job (the
// idempotency key), so a redelivery and a retry by ID both find it.
func (e Entry) Held(id string) ([]byte, bool) {
	if id == "" {
		return nil, false
	}
	if id == e.JobID {
		return e.Result, true
	}
	if e.view != nil {
		if res, found, ok := e.view.lookup(e, id); ok {
			return res, found
		}
	}
	for i := len(e.Recent) - 1; i >= 0; i-- {
		if e.Recent[i].ID == id {
			return e.Recent[i].Result, true
		}
	}
	return nil, false
}

// UpdateFunc computes a key's next value and the job's result from the
// current value (nil if none). Returning an error writes nothing.
type UpdateFunc func(current []byte) (next, result []byte, err error)

// Apply runs fn against the key's current value and stores its output with
// compare-and-set, together with job.Seq, job.Fence and the job's outcome.
// It returns fn's result, or the held result when the job had already been
// applied (a redelivery, or the same job ID submitted again). A job whose
// sequence is at or below the stored one without a held outcome gets
// ErrGap and writes nothing.
func (s *Store) Apply(ctx context.Context, job core.Job, fn UpdateFunc) ([]byte, error) {
	k := Key(job.Key)
	var out []byte
	err := Loop(ctx, func(reread bool) error {
		cur, rev, err := s.current(ctx, k, job.Fence, reread)
		if err != nil {
			return err
		}
		if res, applied, err := s.check(cur, rev, job); err != nil || applied {
			out = res
			return err
		}
		next, result, err := fn(cur.Value)
		if err != nil {
			return err
		}
		e := s.next(cur, next, job.Fence, []core.Job{job}, [][]byte{result})
		// The worker cancels ctx the moment its lease is no longer
		// trusted; check as late as possible before writing.
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.write(ctx, -1, k, rev, e, 0); err != nil {
			if Conflict(err) {
				return err
			}
			return writeError(job.Key, err)
		}
		out = result
		return nil
	})
	if errors.Is(err, ErrTooManyWriters) {
		return nil, fmt.Errorf("keylane: state %q: %w", job.Key, err)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// check decides, before running, what a job may do against the key's
// current entry: it was applied (its held result), it must not run
// (ErrStaleFence, ErrGap, ErrEpoch), or it runs (neither).
func (s *Store) check(cur Entry, rev uint64, job core.Job) (res []byte, applied bool, err error) {
	if rev == 0 {
		return nil, false, nil
	}
	if cur.Fence > job.Fence {
		return nil, false, fmt.Errorf("%w (job fence %d, stored fence %d)", core.ErrStaleFence, job.Fence, cur.Fence)
	}
	if res, ok := cur.Held(job.ID); ok {
		return res, true, nil
	}
	switch s.epochRelation(cur, job.Partition) {
	case epochSame:
		// Jobs of one batch message share Seq and apply in the order of
		// their index: (Seq, Index) orders them. A job at or before the
		// position applied last whose outcome is not held is a gap,
		// whatever its batch: it was applied and forgotten, or
		// dead-lettered before a later job of its key applied.
		if job.Seq < cur.Seq || job.Seq == cur.Seq && job.Index() <= cur.Index {
			return nil, false, fmt.Errorf("%w (key %q: job %s at seq %d/%d, applied up to seq %d/%d, job's outcome not held)", core.ErrGap, job.Key, job.ID, job.Seq, job.Index(), cur.Seq, cur.Index)
		}
	case epochForeign:
		return nil, false, fmt.Errorf("%w (key %q written under epoch %x, the jobs stream is epoch %x)", core.ErrEpoch, job.Key, cur.Epoch, s.epochFor(job.Partition))
	}
	return nil, false, nil
}

type epochRelation int

const (
	epochSame    epochRelation = iota // sequences compare
	epochAdopted                      // an earlier stream this one took over: only IDs compare
	epochForeign                      // another stream: refuse
)

// Adopt replaces the adopted epochs (they only grow).
func (s *Store) Adopt(epochs []uint64) {
	s.mu.Lock()
	s.adopted = slices.Clone(epochs)
	s.mu.Unlock()
}

// epochFor returns the epoch of the jobs stream shard that holds
// partition p, or 0 when epochs are not checked.
func (s *Store) epochFor(p int) uint64 {
	s.mu.Lock()
	epochOf := s.epochOf
	s.mu.Unlock()
	if epochOf == nil {
		return 0
	}
	return epochOf(p)
}

// epochRelation relates an entry of a key of partition p to p's jobs
// stream.
func (s *Store) epochRelation(e Entry, p int) epochRelation {
	own := s.epochFor(p)
	if own == 0 || e.Epoch == 0 || e.Epoch == own {
		return epochSame
	}
	s.mu.Lock()
	adopted := slices.Contains(s.adopted, e.Epoch)
	s.mu.Unlock()
	switch {
	case adopted:
		return epochAdopted
	default:
		return epochForeign
	}
}

// Get returns the key's current entry; a key never written returns a zero
// Entry and no error.
func (s *Store) Get(ctx context.Context, key string) (Entry, error) {
	e, _, err := s.Read(ctx, Key(key))
	return e, err
}
