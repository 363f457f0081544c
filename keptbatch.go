package keylane

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Kept outcomes as one atomic batch (jetstream/doc.go, "Kept outcomes in
// one batch"). A group's outcomes go to the results bucket as one
// JetStream atomic batch with one ack, which a cluster replicates as one
// proposal and a server with sync_interval: always stores with one fsync
// of the stream, instead of one publish, ack (and fsync) per outcome; by
// default only on a replicated namespace (WorkerConfig.OutcomeBatch). A
// server that refuses the batch form gets the outcomes one by one, at
// once, and the worker keeps to that for keptBatchPause.

const (
	// keptBatchMax is the server's default largest atomic batch
	// (JetStreamLimits.MaxBatchSize); a server configured lower says so
	// and the worker halves it.
	keptBatchMax = 1000
	// keptBatchPause is how long a worker keeps outcomes one by one after
	// the server refused the batch form, before it tries a batch again (a
	// stream given AllowAtomicPublish, a server upgraded to 2.12).
	keptBatchPause = time.Minute
)

// kvPut is one kept outcome: its subject in the results bucket and its
// encoded value.
type kvPut struct {
	subject string
	value   []byte
}

// keptBatches is a worker's memory of how the results stream takes
// batches. Its zero value tries batches of keptBatchMax. Safe for
// concurrent use.
type keptBatches struct {
	mu       sync.Mutex
	offUntil time.Time // batches refused: single puts until then
	max      int       // largest batch to send; 0 means keptBatchMax

	batches atomic.Int64 // batches committed
	refused atomic.Int64 // batches refused, their outcomes put one by one
}

// limit returns the largest batch to send now, or 0 while batches are off.
func (k *keptBatches) limit(now time.Time) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Before(k.offUntil) {
		return 0
	}
	if k.max == 0 {
		return keptBatchMax
	}
	return k.max
}

// refuse remembers that the server refused a batch of n for err: a batch
// too large halves the limit (down to 2; smaller turns batches off); a full server (too many batches in flight)
// or an incomplete batch (a message lost on the way, the batch timed out
// or the stream changed leader) is forgotten; anything else turns batches
// off for keptBatchPause. It reports whether batches are now off.
func (k *keptBatches) refuse(err error, n int, now time.Time) bool {
	k.refused.Add(1)
	k.mu.Lock()
	defer k.mu.Unlock()
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsBatchTooLarge && n >= 4:
		k.max = n / 2
		return false
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jsBatchTooManyInflight || apiErr.ErrorCode == jsBatchIncomplete):
		return false
	}
	k.offUntil = now.Add(keptBatchPause)
	return true
}

// Server error codes of atomic batches (nats-server jetstream_errors).
const (
	jsBatchDisabled          = 10174 // the stream lacks AllowAtomicPublish
	jsBatchMissingSeq        = 10175
	jsBatchIncomplete        = 10176 // a gap, a timeout, a leader change
	jsBatchUnsupportedHeader = 10177
	jsBatchInvalidID         = 10179
	jsBatchTooLarge          = 10199
	jsBatchInvalidCommit     = 10200
	jsBatchTooManyInflight   = 10210
)

// batchRefused reports whether err says the server did not take the
// batch (so the outcomes go one by one, each with its own ack, now), as
// opposed to a request that failed (no ack in time, no responders, no
// leader), which the caller retries with backoff. An incomplete batch
// counts as refused: the messages without a reply are the batch form's
// own way to get lost (a full ingest queue drops them silently), which
// single puts do not share.
func batchRefused(err error) bool {
	if errors.Is(err, errBatchIgnored) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jsBatchDisabled, jsBatchMissingSeq, jsBatchIncomplete, jsBatchUnsupportedHeader, jsBatchInvalidID,
		jsBatchTooLarge, jsBatchInvalidCommit, jsBatchTooManyInflight:
		return true
	}
	return false
}

// keepBatched stores puts as atomic batches, each waited on before the
// next. It reports sent=false, with nothing to retry, when the batch form
// is off or was just refused: the caller then puts them one by one, now
// (a put of an outcome a refused batch may have stored is harmless: the
// same value under the same key). An error is a batch that failed on the
// way; the caller retries with backoff.
func (o *owner) keepBatched(puts []kvPut) (sent bool, err error) {
	least := o.w.outcomeBatchMin()
	if least == 0 || len(puts) < least {
		return false, nil
	}
	kb := &o.w.kept
	limit := kb.limit(time.Now())
	if limit == 0 {
		return false, nil
	}
	for len(puts) > 0 {
		n := min(len(puts), limit)
		if err := o.sendKeptBatch(puts[:n]); err != nil {
			if !batchRefused(err) {
				return true, err
			}
			if kb.refuse(err, n, time.Now()) {
				o.log.Warn("results stream refuses atomic batches; keeping outcomes one by one", "for", keptBatchPause, "err", err)
			}
			return false, nil
		}
		kb.batches.Add(1)
		puts = puts[n:]
	}
	return true, nil
}

// outcomeBatchMin returns the fewest puts that go as a batch
// (WorkerConfig.OutcomeBatch), or 0 for none.
func (w *Worker) outcomeBatchMin() int {
	switch n := w.cfg.OutcomeBatch; {
	case n < 0:
		return 0
	case n > 0:
		return max(n, 2) // a batch of one is a plain put
	case w.topo != nil && w.topo.Replicas > 1:
		return 2
	}
	return 0
}

// sendKeptBatch publishes puts as one atomic batch and waits for the
// commit's ack: the earlier messages go without a reply subject (the
// server answers only a failed commit, or a good one naming the batch).
func (o *owner) sendKeptBatch(puts []kvPut) error {
	id := nuid.Next()
	n := len(puts)
	for i, p := range puts[:n-1] {
		m := &nats.Msg{Subject: p.subject, Data: p.value}
		markBatch(m, id, i+1, false)
		if err := o.w.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	m := &nats.Msg{Subject: puts[n-1].subject, Data: puts[n-1].value}
	markBatch(m, id, n, true)
	ctx, cancel := context.WithTimeout(o.ctx, requestTimeout)
	defer cancel()
	ack, err := o.w.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return err
	}
	if err := batchStored(ack, id, n); err != nil {
		return natsError(err)
	}
	// The commit's ack carries the sequence of the batch's last message.
	var stored struct {
		Seq uint64 `json:"seq"`
	}
	if json.Unmarshal(ack.Data, &stored) == nil && stored.Seq > 0 {
		o.noteKept(puts[n-1].subject, stored.Seq)
	}
	return nil
}
