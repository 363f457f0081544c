package keylane

import (
	"github.com/keylane/keylane/internal/kept"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/nats-io/nats.go"
)

// The tenure's names (internal/tenure, internal/kept) under those the
// root's tests call them by.

var (
	encodeResult = tenure.EncodeResult
	replyMsg     = tenure.ReplyMsg
	heldMsg      = tenure.HeldMsg
	settleAcks   = tenure.SettleAcks
	leaderGet    = kept.LeaderGet
	batchOrigin  = kept.BatchOrigin
)

const (
	deadErrorMax      = tenure.DeadErrorMax
	headerBatchOrigin = kept.HeaderBatchOrigin
)

type unreadableOutcomeError = kept.UnreadableError

// keptOutcome is a job's outcome as kept by ID.
type keptOutcome struct {
	res []byte
	err error
}

// keptValue reads the last entry of job id in the results bucket
// (kept.Value): its outcome, or nil when none is kept.
func keptValue(id string, h nats.Header, data []byte) *keptOutcome {
	k := kept.Value(id, h, data)
	if k == nil {
		return nil
	}
	return &keptOutcome{res: k.Res, err: k.Err}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
