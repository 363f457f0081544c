// Package jsbatch is JetStream's atomic batch publish (nats-server 2.12
// and later, on a stream with AllowAtomicPublish) as keylane's rooms use
// it: messages 1..n carry the batch's ID and their sequence, the last also
// the commit; the server stores all or none, and acks the commit only,
// naming the batch and its size.
//
// internal/statestore (several keys' state writes in one batch) and
// internal/kept (a group's kept outcomes in one batch) both send them
// through this package: one marking, one ack check, one reading of the
// server's refusals.
package jsbatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/keylane/keylane/internal/natserr"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The headers of an atomic batch's messages.
const (
	IDHeader     = "Nats-Batch-Id"
	SeqHeader    = "Nats-Batch-Sequence"
	CommitHeader = "Nats-Batch-Commit"
)

// Pause is how long a worker sends one by one after the server refused
// the batch form, before it tries a batch again (a stream given
// AllowAtomicPublish, a server upgraded to 2.12).
const Pause = time.Minute

// Mark makes m message seq (from 1) of atomic batch id, and its commit
// when last. It sets m's headers in place.
func Mark(m *nats.Msg, id string, seq int, last bool) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[IDHeader] = []string{id}
	m.Header[SeqHeader] = []string{strconv.Itoa(seq)}
	if last {
		m.Header[CommitHeader] = []string{"1"}
	} else {
		delete(m.Header, CommitHeader)
	}
}

// ErrIgnored is a good ack of a batch's commit that does not name the
// batch: the server (before 2.12) ignored the batch headers and stored the
// messages one by one, the earlier ones unacknowledged.
var ErrIgnored = errors.New("keylane: the server acked the batch commit as a single message (atomic batches need nats-server 2.12)")

// Stored returns nil if m, the ack of a batch commit, says the server
// stored atomic batch id of n messages; else the ack's error, or
// ErrIgnored.
func Stored(m *nats.Msg, id string, n int) error {
	if _, err := natserr.AckError(m); err != nil {
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
		return ErrIgnored
	}
	return nil
}

// Server error codes of atomic batches (nats-server jetstream_errors).
const (
	CodeDisabled          = 10174 // the stream lacks AllowAtomicPublish
	CodeMissingSeq        = 10175
	CodeIncomplete        = 10176 // a gap, a timeout, a leader change
	CodeUnsupportedHeader = 10177
	CodeInvalidID         = 10179
	CodeTooLarge          = 10199
	CodeInvalidCommit     = 10200
	CodeTooManyInflight   = 10210
)

// Refused reports whether err says the server did not take the batch (so
// the messages go one by one, each with its own ack, now), as opposed to
// a request that failed (no ack in time, no responders, no leader), which
// the caller retries with backoff. An incomplete batch counts as refused:
// the messages without a reply are the batch form's own way to get lost
// (a full ingest queue drops them silently), which single puts do not
// share.
func Refused(err error) bool {
	if errors.Is(err, ErrIgnored) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case CodeDisabled, CodeMissingSeq, CodeIncomplete, CodeUnsupportedHeader, CodeInvalidID,
		CodeTooLarge, CodeInvalidCommit, CodeTooManyInflight:
		return true
	}
	return false
}
