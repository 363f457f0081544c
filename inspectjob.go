package keylane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Places InspectJob finds a job's outcome in (FoundJob.Where).
const (
	// FoundResults is the results bucket's entry of the job's ID.
	FoundResults = "results"
	// FoundBatch is the results bucket's entry of the job's batch
	// (wire.BatchOutcomesKey), for a Call that travelled in a batch.
	FoundBatch = "batch"
	// FoundState is the held outcomes of the job's key's state entry.
	FoundState = "state"
	// FoundDead is the dead-letter stream.
	FoundDead = "dead"
)

// FoundJob is a job's outcome as InspectJob found it, and where.
type FoundJob struct {
	ID string
	// Where names the place it was found in: FoundResults, FoundBatch,
	// FoundState or FoundDead.
	Where string
	// Result is the job's result; nil when it failed.
	Result []byte
	// Err is the job's failure, a *RemoteError (DeadLettered when it was
	// dead-lettered); nil when it succeeded.
	Err error `json:"-"`
	// Error is Err's text, for JSON.
	Error string `json:",omitempty"`
	// Dead is the job's dead letter: set when Where is FoundDead, and
	// when a kept outcome says the job was dead-lettered and its dead
	// letter is still in the stream.
	Dead *DeadLetter `json:",omitempty"`
}

// InspectState reads the state entry of a resource key of a namespace:
// its value, the fence, sequence and batch index of the last job applied
// to it, and the outcomes it holds. It returns the entry's revision in
// the state bucket, ErrNoState for a key without an entry, an error
// wrapping the partition package's key error (ErrEmptyKey, …) for an invalid key and ErrNoTopology when the
// namespace has no state bucket. It only reads.
func InspectState(ctx context.Context, js jetstream.JetStream, namespace, key string) (StateEntry, uint64, error) {
	if err := wire.ValidateKey(key); err != nil {
		return StateEntry{}, 0, fmt.Errorf("keylane: key %q: %w", key, err)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	kv, err := js.KeyValue(ctx, Names{Namespace: namespace}.State())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return StateEntry{}, 0, fmt.Errorf("keylane: namespace %s has no state bucket: %w", namespace, ErrNoTopology)
	}
	if err != nil {
		return StateEntry{}, 0, fmt.Errorf("keylane: state bucket: %w", err)
	}
	e, rev, err := NewState(kv).read(ctx, StateKey(key))
	if err != nil {
		return StateEntry{}, 0, err
	}
	if rev == 0 {
		return StateEntry{}, 0, ErrNoState
	}
	return e, rev, nil
}

// InspectJob finds the outcome of the job with ID id in namespace, where
// keylane keeps one: the results bucket by ID; for an ID naming a batch
// and an index (wire.BatchedJobID), its batch's outcomes entry; with key
// not empty, the held outcomes of that key's state entry (a Reducer's
// job); and the dead-letter stream, which it reads through from the
// oldest message (headers only) for a dead letter with that job ID. It
// returns ErrNoResult when none holds it: kept outcomes expire with the
// results bucket's TTL (TopologyConfig.ResultsTTL), held ones leave the
// key's window (HeldJobs), dead letters after 7 days or a purge. It only
// reads.
func InspectJob(ctx context.Context, js jetstream.JetStream, namespace, id, key string) (FoundJob, error) {
	if err := ValidateJobID(id); err != nil {
		return FoundJob{}, err
	}
	if key != "" {
		if err := wire.ValidateKey(key); err != nil {
			return FoundJob{}, fmt.Errorf("keylane: key %q: %w", key, err)
		}
	}
	names := Names{Namespace: namespace}
	out := FoundJob{ID: id}
	gctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	kv, err := js.KeyValue(gctx, names.Results())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return out, fmt.Errorf("keylane: namespace %s has no results bucket: %w", namespace, ErrNoTopology)
	}
	if err != nil {
		return out, fmt.Errorf("keylane: results bucket: %w", err)
	}
	var value []byte
	e, err := kv.Get(gctx, id)
	switch {
	case err == nil:
		value, out.Where = e.Value(), FoundResults
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		if batchID, index, batched := wire.ParseBatchedJobID(id); batched {
			e, err := kv.Get(gctx, wire.BatchOutcomesKey(batchID))
			switch {
			case err == nil && !holdsIndex(e.Value(), index):
				// Not kept there: a Submit of the batch, or an index it
				// never had. The held outcomes and dead letters may
				// still hold it.
			case err == nil:
				v, ferr := wire.FindBatchOutcome(e.Value(), batchID, index, id)
				switch {
				case errors.Is(ferr, wire.ErrNoBatchOutcome):
					// The entry keeps none for this job: look on.
				case ferr != nil:
					return out, fmt.Errorf("keylane: stored outcome of %s in its batch's entry: %w", id, ferr)
				default:
					value, out.Where = v, FoundBatch
				}
			case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
				return out, fmt.Errorf("keylane: results bucket: %w", err)
			}
		}
	default:
		return out, fmt.Errorf("keylane: results bucket: %w", err)
	}
	if out.Where != "" {
		res, rerr, ok := decodeResult(value)
		if !ok {
			return out, fmt.Errorf("keylane: malformed stored result for %s", id)
		}
		out.Result, out.Err = res, rerr
		if re := (*RemoteError)(nil); errors.As(rerr, &re) && re.DeadLettered {
			if d, found, err := findDead(ctx, js, namespace, id); err == nil && found {
				out.Dead = &d
			}
		}
		return out.withErrorText(), nil
	}
	if key != "" {
		e, _, err := InspectState(ctx, js, namespace, key)
		switch {
		case err == nil:
			if res, ok := e.Held(id); ok {
				out.Where, out.Result = FoundState, res
				return out, nil
			}
		case !errors.Is(err, ErrNoState):
			return out, err
		}
	}
	d, found, err := findDead(ctx, js, namespace, id)
	if err != nil {
		return out, err
	}
	if found {
		out.Where, out.Dead = FoundDead, &d
		out.Err = &RemoteError{Message: d.Error, Permanent: true, DeadLettered: true}
		return out.withErrorText(), nil
	}
	return out, ErrNoResult
}

// holdsIndex reports whether batch entry b, when it decodes, holds an
// outcome at index: a batch's entry keeps only its Calls' outcomes, so a
// Submit of the batch (dead-lettered, or held in its key's state) is
// looked for elsewhere. An entry that does not decode holds it, for
// wire.FindBatchOutcome to say what is wrong with it.
func holdsIndex(b []byte, index int) bool {
	_, outs, err := wire.DecodeBatchOutcomes(b)
	if err != nil {
		return true
	}
	for _, o := range outs {
		if o.Index == index {
			return true
		}
	}
	return false
}

func (o FoundJob) withErrorText() FoundJob {
	if o.Err != nil {
		o.Error = o.Err.Error()
	}
	return o
}

// deadScanBatch is how many dead letters' headers findDead asks for at
// once.
const deadScanBatch = 256

// deadScanIdle is how long the server keeps a dead-letter scan's consumer
// that its scan did not delete (a connection lost mid-scan).
const deadScanIdle = 30 * time.Second

// deadScanStarted, when set (by a test), runs once findDead has made its
// consumer, before its first pull.
var deadScanStarted func()

// findDead reads the dead-letter stream's headers, oldest first up to the
// last message when it began, for the newest dead letter of job ID id,
// and returns it whole. A namespace without a dead-letter stream has none.
func findDead(ctx context.Context, js jetstream.JetStream, namespace, id string) (DeadLetter, bool, error) {
	s, err := deadStream(ctx, js, namespace)
	if errors.Is(err, ErrNoTopology) {
		return DeadLetter{}, false, nil
	}
	if err != nil {
		return DeadLetter{}, false, err
	}
	ictx, cancel := context.WithTimeout(ctx, requestTimeout)
	info, err := s.Info(ictx)
	cancel()
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("keylane: dead-letter stream: %w", err)
	}
	if info.State.Msgs == 0 {
		return DeadLetter{}, false, nil
	}
	last := info.State.LastSeq
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	// The server removes an idle consumer after InactiveThreshold; the
	// scan deletes its own when done, so a status page looking a job up on
	// every reload leaves none behind.
	//
	// Every Fetch of an ordered consumer makes a new consumer (nats.go's
	// reset), and by default tries again without end while the server
	// refuses it (the stream deleted under the scan, JetStream gone),
	// bound by no context: one try, and the scan fails with why.
	cons, err := s.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{HeadersOnly: true, InactiveThreshold: deadScanIdle, MaxResetAttempts: 1})
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: %w", err)
	}
	if deadScanStarted != nil {
		deadScanStarted()
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
			_ = s.DeleteConsumer(dctx, ci.Name)
			cancel()
		}
	}()
	var match, seen uint64
	// Each pull asks for as many messages as the stream holds beyond the
	// last one read (NumPending), so it is answered as soon as they came,
	// never by its wait running out at the stream's end.
	want := min(uint64(deadScanBatch), info.State.Msgs)
	for want > 0 {
		if err := ctx.Err(); err != nil {
			return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: %w", err)
		}
		batch, err := cons.Fetch(int(want), jetstream.FetchMaxWait(requestTimeout))
		if err != nil {
			return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: %w", err)
			}
			if md.Sequence.Stream > last {
				want = 0
				break
			}
			seen = md.Sequence.Stream
			if wire.JobIDOfDead(m.Headers()) == id {
				match = md.Sequence.Stream
			}
			want = min(uint64(deadScanBatch), md.NumPending)
			if md.Sequence.Stream == last {
				want = 0
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: %w", err)
		}
		if n == 0 {
			// Nothing came: fine if the rest was deleted under us (a
			// purge, a redrive), else the read failed, and "not found"
			// would be a guess.
			ictx, cancel := context.WithTimeout(ctx, requestTimeout)
			info, err := s.Info(ictx)
			cancel()
			if err != nil {
				return DeadLetter{}, false, fmt.Errorf("keylane: dead-letter stream: %w", err)
			}
			if info.State.Msgs > 0 && info.State.LastSeq > seen && info.State.FirstSeq <= last {
				return DeadLetter{}, false, fmt.Errorf("keylane: read the dead-letter stream: no message came after sequence %d of %d", seen, last)
			}
			break
		}
	}
	if match == 0 {
		return DeadLetter{}, false, nil
	}
	d, err := readDead(ctx, s, match)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, false, nil // redriven or purged since
	}
	if err != nil {
		return DeadLetter{}, false, fmt.Errorf("keylane: dead letter %d: %w", match, err)
	}
	return d, true, nil
}
