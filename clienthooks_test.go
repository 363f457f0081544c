package keylane

import (
	"github.com/keylane/keylane/internal/client"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/nats-io/nats.go"
)

// The client engine's names the tests of this package use, from
// internal/client (its test hooks are in its testhooks.go).

func decodeReply(m *nats.Msg) ([]byte, error) { return client.DecodeReply(m) }

func newID() string { return client.NewID() }

func retryablePublish(err error) bool { return natserr.IsTransient(err) }

// backlogFull reports whether err is the server's refusal of a job over
// the per-subject limit (MaxMsgsPerSubject with DiscardNewPerSubject).
func backlogFull(err error) bool { return natserr.PerSubjectCap(err) }

const (
	headerSealedBatch = client.HeaderSealedBatch
	outcomePoll       = client.OutcomePoll
)

// groupedOutcome is a grouped reply entry's outcome as Call gets it.
func groupedOutcome(enc []byte) ([]byte, error, bool) { return client.GroupedOutcome(enc) }
