package kept

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
	// the server refused the batch form, before it tries a batch again (a
	// stream given AllowAtomicPublish, a server upgraded to 2.12).
	BatchPause = time.Minute
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
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsBatchTooLarge && n >= 4:
		m.max = n / 2
		return false
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jsBatchTooManyInflight || apiErr.ErrorCode == jsBatchIncomplete):
		return false
	}
	m.offUntil = now.Add(BatchPause)
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

// BatchRefused reports whether err says the server did not take the
// batch (so the outcomes go one by one, each with its own ack, now), as
// opposed to a request that failed (no ack in time, no responders, no
// leader), which the caller retries with backoff. An incomplete batch
// counts as refused: the messages without a reply are the batch form's
// own way to get lost (a full ingest queue drops them silently), which
// single puts do not share.
func BatchRefused(err error) bool {
	if errors.Is(err, ErrBatchIgnored) {
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
			if !BatchRefused(err) {
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
		MarkBatch(m, id, i+1, false)
		if err := s.nc.PublishMsg(m); err != nil {
			return err
		}
	}
	m := &nats.Msg{Subject: puts[n-1].Subject, Data: puts[n-1].Value}
	MarkBatch(m, id, n, true)
	ctx, cancel := context.WithTimeout(ctx, core.RequestTimeout)
	defer cancel()
	ack, err := s.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return err
	}
	if err := BatchStored(ack, id, n); err != nil {
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

// AllowAtomicPublish lets the stream named name (the results bucket's)
// take atomic batches, updating a stream made by an older keylane in
// place. A server that refuses the flag (before 2.12) leaves it off, and
// workers keep outcomes one by one; only a failed request is an error
// (Setup tries again).
func AllowAtomicPublish(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	sc := s.CachedInfo().Config
	if sc.AllowAtomicPublish {
		return nil
	}
	sc.AllowAtomicPublish = true
	_, err = js.UpdateStream(ctx, sc)
	var apiErr *jetstream.APIError
	if err != nil && !errors.As(err, &apiErr) {
		return fmt.Errorf("keylane: allow atomic batches on %s: %w", name, natserr.Once(err))
	}
	return nil
}

// JetStream atomic batches (nats-server 2.12 and later, on a stream with
// AllowAtomicPublish): messages 1..n carry the batch's ID and their
// sequence, the last also the commit; the server stores all or none, and
// acks the commit only, naming the batch and its size.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// MarkBatch makes m message seq (from 1) of atomic batch id, and its
// commit when last. It sets m's headers in place.
func MarkBatch(m *nats.Msg, id string, seq int, last bool) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[batchIDHeader] = []string{id}
	m.Header[batchSeqHeader] = []string{strconv.Itoa(seq)}
	if last {
		m.Header[batchCommitHeader] = []string{"1"}
	} else {
		delete(m.Header, batchCommitHeader)
	}
}

// ErrBatchIgnored is a good ack of a batch's commit that does not name the
// batch: the server (before 2.12) ignored the batch headers and stored the
// messages one by one, the earlier ones unacknowledged.
var ErrBatchIgnored = errors.New("keylane: the server acked the batch commit as a single message (atomic batches need nats-server 2.12)")

// BatchStored returns nil if m, the ack of a batch commit, says the server
// stored atomic batch id of n messages; else the ack's error, or
// ErrBatchIgnored.
func BatchStored(m *nats.Msg, id string, n int) error {
	if err := ackError(m); err != nil {
		return err
	}
	var ack struct {
		Batch string `json:"batch"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return fmt.Errorf("bad stream ack %q: %w", m.Data, err)
	}
	if ack.Batch != id || ack.Count != n {
		return ErrBatchIgnored
	}
	return nil
}

// ackError returns the error a stream ack carries, or nil for a good one
// (the error half of the root's pubAckError, which a Call's ack reads
// too).
func ackError(m *nats.Msg) error {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return jetstream.ErrNoStreamResponse
	}
	if !bytes.Contains(m.Data, []byte(`"error"`)) {
		return nil
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("bad stream ack %q: %w", m.Data, err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	return nil
}
