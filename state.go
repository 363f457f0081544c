package keylane

import (
	"context"
	"slices"

	"github.com/keylane/keylane/internal/statestore"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// State keeps one value per resource key in a KV bucket and applies updates
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
// outcome. An entry must also fit in one message: a State of a Topology
// shrinks the window, oldest first, to fit the server's max_payload, and
// refuses with ErrStateTooLarge (permanent) an entry that cannot fit with
// only the outcomes it writes (jetstream/doc.go, "Outcomes are held").
//
// Since jobs of one key run one at a time on the partition owner, the owner
// caches the last revision it wrote and usually needs one round trip per
// job. State is safe for concurrent use.
//
// The engine is internal/statestore's Store; State is its API.
type State struct {
	s *statestore.Store
}

// Bounds of the outcomes a state entry holds: the last HeldJobs jobs of the
// key, and no more than HeldBytes of their IDs and results.
const (
	HeldJobs  = statestore.HeldJobs
	HeldBytes = statestore.HeldBytes
)

// StateEntry is a decoded state entry.
type StateEntry = statestore.Entry

// AppliedResult is the outcome of one applied job.
type AppliedResult = statestore.AppliedResult

// UpdateFunc computes a key's next value and the job's result from the
// current value (nil if none). Returning an error writes nothing.
type UpdateFunc = statestore.UpdateFunc

// NewState returns a State on kv (usually Topology.State) that does not
// check epochs. Workers use Topology.NewState, which does.
func NewState(kv jetstream.KeyValue) *State {
	return &State{s: statestore.New(statestore.Config{KV: kv})}
}

// Apply runs fn against the key's current value and stores its output with
// compare-and-set, together with job.Seq, job.Fence and the job's outcome.
// It returns fn's result, or the held result when the job had already been
// applied (a redelivery, or the same job ID submitted again). A job whose
// sequence is at or below the stored one without a held outcome gets
// ErrGap and writes nothing.
func (s *State) Apply(ctx context.Context, job Job, fn UpdateFunc) ([]byte, error) {
	return s.s.Apply(ctx, job, fn)
}

// Get returns the key's current entry; a key never written returns a zero
// StateEntry and no error.
func (s *State) Get(ctx context.Context, key string) (StateEntry, error) {
	return s.s.Get(ctx, key)
}

// StateKey is the KV key that holds a resource key's state: the key in
// unpadded base64url, since KV keys allow only a few characters.
func StateKey(key string) string { return statestore.Key(key) }

// The worker's side of its State: the old names of the store's methods,
// for the worker's call sites (a tenure calls the Store itself:
// tenure.Config.State).

// newWorkerState is a worker's State before its Start binds it.
func newWorkerState() *State { return NewState(nil) }

// topologyState is Topology.NewState: a State bound to t.
func topologyState(t *Topology) *State {
	s := NewState(nil)
	s.bind(t)
	return s
}

// stateConfig is what a State of t works on: its state bucket, the epoch
// of each jobs stream shard, the adopted epochs, and the connection whose
// max_payload bounds an entry.
func stateConfig(t *Topology) statestore.Config {
	epochs := slices.Clone(t.Epochs)
	cfg := statestore.Config{KV: t.State, Adopted: t.Meta.Adopted, Conn: t.conn()}
	if len(epochs) > 0 {
		cfg.EpochOf = func(p int) uint64 { return epochs[ShardOf(p, len(epochs))] }
	}
	return cfg
}

// bind points s at a topology's state bucket and epochs (Worker.Start, and
// again when a repartition replaced the jobs streams), and forgets what it
// cached.
func (s *State) bind(t *Topology) { s.s.Bind(stateConfig(t)) }

// adopt replaces the adopted epochs (they only grow).
func (s *State) adopt(epochs []uint64) { s.s.Adopt(epochs) }

// read returns the entry of state bucket key k and its revision.
func (s *State) read(ctx context.Context, k string) (StateEntry, uint64, error) {
	return s.s.Read(ctx, k)
}

// batchWrites turns s's coalescing of writes on (on nc, the worker's
// connection) or off (Store.BatchWrites).
func (s *State) batchWrites(on bool, nc *nats.Conn, bucket string) { s.s.BatchWrites(on, nc, bucket) }

// closeBatches stops s's coalescing, waiting (up to ctx) for the batches
// in flight.
func (s *State) closeBatches(ctx context.Context) { s.s.CloseBatches(ctx) }

// stateBatchOn reports whether the worker coalesces state writes: only
// when its StateBatch is positive. Measured, it did not pay by default:
// on one replica nats-server stages each atomic batch in a file store of
// its own (skewed Call 5x slower), and on the three-node bench cluster
// (R3, three servers on two cores) it was slightly slower too (see
// jetstream/doc.go, "State writes of several keys in one batch").
func (w *Worker) stateBatchOn() bool { return w.cfg.StateBatch > 0 }

// conn is the connection t's requests go on; nil if not known.
func (t *Topology) conn() *nats.Conn {
	if t == nil || t.js == nil {
		return nil
	}
	return t.js.Conn()
}
