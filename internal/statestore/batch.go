package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	jobbatcher "github.com/keylane/keylane/internal/batcher"
	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/jsbatch"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Several keys' state writes in one atomic batch (WorkerConfig.StateBatch;
// see "State writes of several keys in one batch" in package jetstream's
// doc). On a catalog a key's group is one job, so the group commit's one
// compare-and-set per group is one per job. The lanes of one partition
// that finish a group while another of its writes is in flight queue
// their compare-and-sets (internal/batcher: a lone write goes at once,
// alone, as today); when it returns, the queue goes as one JetStream
// atomic batch, each message carrying its own
// Nats-Expected-Last-Subject-Sequence: one request, one ack, one
// replicated proposal for all. Atomic means that a refusal stores none of
// them: then each write goes again alone, so each gets its own answer (a
// conflict is one key's, not its neighbours'). A batch whose ack does not
// come is an unknown outcome for every write of it, as for one write.

// stateBatchMaxWrites and stateBatchMaxBytes cut a batch of state writes
// (the server takes atomic batches of up to 1000 messages).
const (
	stateBatchMaxWrites = 64
	stateBatchMaxBytes  = 4 << 20
)

// stateWrite is one compare-and-set of a key's entry: k from revision rev
// (0: the key is new).
type stateWrite struct {
	k     string
	rev   uint64
	value []byte
}

// stateBatches is a Store's coalescing of its partitions' writes, nil
// when off.
type stateBatches struct {
	b      *jobbatcher.Batcher[stateWrite, uint64]
	nc     *nats.Conn
	bucket string // the state bucket's name: its messages' subjects are $KV.<bucket>.<key>

	sent    atomic.Int64 // batches of two writes or more stored
	refused atomic.Int64 // batches refused, their writes sent again alone
	offTill atomic.Int64 // unix nanoseconds: the stream refused the batch form; alone until then
}

// BatchWrites turns s's coalescing of writes on (on nc, the worker's
// connection) or off. It keeps a batcher already running.
//
// Its callers (the root's Worker.Start and reloadTopology) hold the worker's mutex, so
// two never run at once between the check and the swap below.
func (s *Store) BatchWrites(on bool, nc *nats.Conn, bucket string) {
	s.mu.Lock()
	if on && s.batched != nil && s.batched.bucket == bucket {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), core.RequestTimeout)
	s.CloseBatches(ctx) // the writes in flight end first
	cancel()
	if !on {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := &stateBatches{nc: nc, bucket: bucket}
	var err error
	sb.b, err = jobbatcher.New(jobbatcher.Config[stateWrite, uint64]{
		Send: func(ctx context.Context, _ int, ws []stateWrite) []jobbatcher.Outcome[uint64] {
			return s.sendWrites(ctx, sb, ws)
		},
		Size:     func(w stateWrite) int { return len(w.k) + len(w.value) },
		MaxCount: stateBatchMaxWrites,
		MaxBytes: stateBatchMaxBytes,
	})
	if err != nil {
		return // a Config it cannot run: each write alone, as with StateBatch off
	}
	s.batched = sb
}

// CloseBatches stops s's coalescing, waiting (up to ctx) for the batches
// in flight.
func (s *Store) CloseBatches(ctx context.Context) {
	s.mu.Lock()
	sb := s.batched
	s.batched = nil
	s.mu.Unlock()
	if sb != nil {
		_ = sb.b.Close(ctx)
	}
}

// put is the compare-and-set of a key's entry: through partition p's
// batches when they are on and p is one (a Store.Apply passes -1), else
// alone.
func (s *Store) put(ctx context.Context, kv jetstream.KeyValue, p int, k string, rev uint64, value []byte) (uint64, error) {
	s.mu.Lock()
	sb := s.batched
	s.mu.Unlock()
	if sb == nil || p < 0 || time.Now().UnixNano() < sb.offTill.Load() {
		return Put(ctx, kv, k, rev, value)
	}
	next, err := sb.b.Do(ctx, p, stateWrite{k: k, rev: rev, value: value})
	if errors.Is(err, jobbatcher.ErrClosed) {
		// Closed under us (the worker stops): this write was never sent.
		return Put(ctx, kv, k, rev, value)
	}
	return next, err
}

// sendWrites stores ws: alone when one, else as one atomic batch; a
// batch the server refuses stored nothing, so its writes go again alone.
func (s *Store) sendWrites(ctx context.Context, sb *stateBatches, ws []stateWrite) []jobbatcher.Outcome[uint64] {
	out := make([]jobbatcher.Outcome[uint64], len(ws))
	kv, err := s.bucket()
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	if len(ws) > 1 {
		revs, err := sb.send(ctx, ws)
		if err == nil {
			sb.sent.Add(1)
			for i := range out {
				out[i].Value = revs[i]
			}
			return out
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) && !errors.Is(err, jsbatch.ErrIgnored) {
			// No answer: the batch may or may not be stored, each of
			// its writes an unknown outcome, as one write's would be.
			for i := range out {
				out[i].Err = natserr.Once(err)
			}
			return out
		}
		sb.refused.Add(1)
		if jsbatch.Refused(err) {
			// Not a conflict but the batch form itself: alone for a while.
			sb.offTill.Store(time.Now().Add(jsbatch.Pause).UnixNano())
		}
	}
	for i, w := range ws {
		wctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
		out[i].Value, out[i].Err = Put(wctx, kv, w.k, w.rev, w.value)
		cancel()
	}
	return out
}

// send publishes ws as one atomic batch and returns each write's new
// revision: the batch is stored as consecutive messages, the last at the
// sequence the commit's ack names.
func (sb *stateBatches) send(ctx context.Context, ws []stateWrite) ([]uint64, error) {
	id := nuid.Next()
	n := len(ws)
	msg := func(i int) *nats.Msg {
		m := &nats.Msg{Subject: "$KV." + sb.bucket + "." + ws[i].k, Data: ws[i].value, Header: nats.Header{
			jetstream.ExpectedLastSubjSeqHeader: {strconv.FormatUint(ws[i].rev, 10)},
		}}
		jsbatch.Mark(m, id, i+1, i == n-1)
		return m
	}
	for i := range n - 1 {
		if err := sb.nc.PublishMsg(msg(i)); err != nil {
			return nil, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	ack, err := sb.nc.RequestMsgWithContext(rctx, msg(n-1))
	if err != nil {
		return nil, err
	}
	if err := jsbatch.Stored(ack, id, n); err != nil {
		return nil, err
	}
	var stored struct {
		Seq uint64 `json:"seq"`
	}
	if err := json.Unmarshal(ack.Data, &stored); err != nil || stored.Seq < uint64(n) {
		return nil, errors.New("keylane: an atomic batch's ack without its sequence")
	}
	revs := make([]uint64, n)
	for i := range revs {
		revs[i] = stored.Seq - uint64(n-1-i)
	}
	return revs, nil
}

// BatchStats returns how many batches of two writes or more s stored and
// how many the server refused (their writes sent again alone); on is false
// when s does not coalesce writes.
func (s *Store) BatchStats() (sent, refused int64, on bool) {
	s.mu.Lock()
	sb := s.batched
	s.mu.Unlock()
	if sb == nil {
		return 0, 0, false
	}
	return sb.sent.Load(), sb.refused.Load(), true
}
