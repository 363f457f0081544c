package kept

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/keylane/keylane/internal/jsbatch"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
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
// once, and the worker keeps to that for BatchPause.

const (
	// BatchMax is the server's default largest atomic batch
	// (JetStreamLimits.MaxBatchSize); a server configured lower says so
	// and the worker halves it.
	BatchMax = 1000
	// BatchPause is how long a worker keeps outcomes one by one after
	// the server refused the batch form (jsbatch.Pause).
	BatchPause = jsbatch.Pause
)

// Put is one kept outcome: its subject in the results bucket and its
// encoded value.
type Put struct {
	Subject string
	Value   []byte
}

// limit returns the largest batch to send now, or 0 while batches are off.
func (m *Memory) limit(now time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.Before(m.offUntil) {
		return 0
	}
	if m.max == 0 {
		return BatchMax
	}
	return m.max
}

// refuse remembers that the server refused a batch of n for err: a batch
// too large halves the limit (down to 2; smaller turns batches off); a full server (too many batches in flight)
// or an incomplete batch (a message lost on the way, the batch timed out
// or the stream changed leader) is forgotten; anything else turns batches
// off for BatchPause. It reports whether batches are now off.
func (m *Memory) refuse(err error, n int, now time.Time) bool {
	m.refused.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsbatch.CodeTooLarge && n >= 4:
		m.max = n / 2
		return false
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jsbatch.CodeTooManyInflight || apiErr.ErrorCode == jsbatch.CodeIncomplete):
		return false
	}
	m.offUntil = now.Add(BatchPause)
	return true
}

// KeepBatched stores puts as atomic batches, each waited on before the
// next. It reports sent=false, with nothing to retry, when the batch form
// is off (fewer puts than Config.BatchMin, or a refusal remembered) or was
// just refused: the caller then puts them one by one, now (a put of an
// outcome a refused batch may have stored is harmless: the same value
// under the same key). An error is a batch that failed on the way; the
// caller retries with backoff.
func (s *Store) KeepBatched(ctx context.Context, puts []Put) (sent bool, err error) {
	least := s.min
	if least == 0 || len(puts) < least {
		return false, nil
	}
	mem := s.mem
	limit := mem.limit(time.Now())
	if limit == 0 {
		return false, nil
	}
	for len(puts) > 0 {
		n := min(len(puts), limit)
		if err := s.sendBatch(ctx, puts[:n]); err != nil {
			if !jsbatch.Refused(err) {
				return true, err
			}
			if mem.refuse(err, n, time.Now()) {
				s.log.Warn("results stream refuses atomic batches; keeping outcomes one by one", "for", BatchPause, "err", err)
			}
			return false, nil
		}
		mem.batches.Add(1)
		puts = puts[n:]
	}
	return true, nil
}

// sendBatch publishes puts as one atomic batch and waits for the
// commit's ack: the earlier messages go without a reply subject (the
// server answers only a failed commit, or a good one naming the batch).
func (s *Store) sendBatch(ctx context.Context, puts []Put) error {
	id := nuid.Next()
	n := len(puts)
	for i, p := range puts[:n-1] {
		m := &nats.Msg{Subject: p.Subject, Data: p.Value}
		jsbatch.Mark(m, id, i+1, false)
		if err := s.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	m := &nats.Msg{Subject: puts[n-1].Subject, Data: puts[n-1].Value}
	jsbatch.Mark(m, id, n, true)
	ctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	ack, err := s.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return err
	}
	if err := jsbatch.Stored(ack, id, n); err != nil {
		return natserr.Once(err)
	}
	// The commit's ack carries the sequence of the batch's last message.
	var stored struct {
		Seq uint64 `json:"seq"`
	}
	if json.Unmarshal(ack.Data, &stored) == nil && stored.Seq > 0 {
		s.NoteKept(puts[n-1].Subject, stored.Seq)
	}
	return nil
}
