package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// refused turns the server's refusal of m over its key's backlog cap into
// a *core.KeyBacklogFullError, and passes any other error through. A job the
// caller may retry by ID (WithID, or any Call) whose outcome is kept was
// applied before: its retry is answered from the kept outcome (ok), not
// with "full", so a shop never says "sold out" to a purchase that went
// through (after the duplicate window, which answers such retries first).
// One with no kept outcome may still be queued from the earlier call: a
// *queuedError if the key's queue holds it (queued), "full" only if the
// queue's leader says it does not, and an error saying "unknown" if the
// queue could not be read.
// Only jobs marked Keylane-Idempotent (a caller's ID, or keylane's own
// second copy) cost that one results lookup; a first Call with a generated
// ID cannot have been applied, and is refused at once.
func (c *Client) refused(ctx context.Context, m *nats.Msg, err error) (res []byte, ok bool, _ error) {
	if !natserr.PerSubjectCap(err) {
		return nil, false, err
	}
	full := &core.KeyBacklogFullError{Key: m.Header.Get(wire.HeaderKey), Cap: c.maxKeyBacklog}
	if m.Header.Get(wire.HeaderIdempotent) == "" {
		return nil, false, full
	}
	id := m.Header.Get(wire.HeaderJobID)
	res, rerr := c.Result(ctx, id)
	if errors.Is(rerr, core.ErrNoResult) {
		// No outcome kept: not applied, but perhaps still queued from an
		// earlier call (after the duplicate window), and then it runs.
		// Only a look at the key's queue proves "nothing stored".
		queued, qerr := c.queued(ctx, m, id)
		switch {
		case qerr != nil:
			return nil, false, fmt.Errorf("keylane: key %q is at its backlog cap, and whether job %s is queued from an earlier call is unknown: %w", full.Key, id, qerr)
		case queued:
			return nil, false, &queuedError{id}
		}
		// Not queued now; a copy acked while we looked had its outcome
		// kept first.
		if res, rerr = c.Result(ctx, id); errors.Is(rerr, core.ErrNoResult) {
			return nil, false, full
		}
	}
	if rerr != nil && !isRemote(rerr) {
		// Whether an earlier copy was applied is unknown: never say "full"
		// (nothing stored) for a purchase that may have gone through.
		return nil, false, fmt.Errorf("keylane: key %q is at its backlog cap, and whether job %s was applied before is unknown: %w", full.Key, id, rerr)
	}
	return res, true, rerr
}

func isRemote(err error) bool {
	var re *core.RemoteError
	return errors.As(err, &re)
}

// queuedError says that a job refused over its key's cap is the copy of
// one stored before under its ID and still queued: nothing new stored,
// and the stored one runs. Submit answers it with core.ErrDuplicate, Call by
// waiting for the job's outcome.
type queuedError struct{ id string }

func (e *queuedError) Error() string {
	return fmt.Sprintf("keylane: job %s is queued from an earlier call; nothing new stored", e.id)
}

func (e *queuedError) Unwrap() error { return core.ErrDuplicate }

// queued reports whether the jobs stream holds a job with ID id on m's
// subject (its key's): a stored job not yet finished. It reads the key's
// messages from the stream's leader ($JS.API.STREAM.MSG.GET, never a
// direct get, which a follower may answer from behind): first the
// subject's last message, then the others in order up to it. An earlier
// copy of the job was stored before that last one, and a subject holds at
// most MaxKeyBacklog messages at any time, so at most MaxKeyBacklog+1
// reads, each bounded by core.RequestTimeout, however fast the key's queue
// moves meanwhile. A copy acked during the scan is missed here, but its
// outcome was kept before its ack: the caller looks the outcome up again
// after a "not queued". Any failure is an error: "not queued" only when
// the leader answered for every message. A client user needs
// $JS.API.STREAM.MSG.GET.<jobs stream> for it (the shipped
// docs/security/accounts.conf does not give it: its clients may not read
// jobs, and get "unknown" instead).
func (c *Client) queued(ctx context.Context, m *nats.Msg, id string) (bool, error) {
	api := c.cfg.APIPrefix + "STREAM.MSG.GET." + m.Header.Get(jetstream.ExpectedStreamHeader)
	// A user not allowed to read the jobs stream is refused at once, not
	// after a timeout.
	wctx, stop := natserr.RefusalWatch(ctx, c.nc, c.nc.LastError(), api)
	defer stop()
	get := func(req msgGetRequest) (seq uint64, found, none bool, err error) {
		body, _ := json.Marshal(req)
		rctx, cancel := context.WithTimeout(wctx, core.RequestTimeout)
		resp, err := c.nc.RequestWithContext(rctx, api, body)
		cancel()
		if r := natserr.RefusedCause(wctx); r != nil {
			return 0, false, false, r
		}
		if err != nil {
			return 0, false, false, err
		}
		var r msgGetResponse
		if err := json.Unmarshal(resp.Data, &r); err != nil {
			return 0, false, false, fmt.Errorf("keylane: bad answer from %s: %w", api, err)
		}
		switch {
		case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
			return 0, false, true, nil
		case r.Error != nil:
			return 0, false, false, r.Error
		case r.Message == nil || r.Message.Seq < req.Seq || r.Message.Subject != m.Subject:
			return 0, false, false, fmt.Errorf("keylane: bad answer from %s: %q", api, resp.Data)
		}
		return r.Message.Seq, jobIDOf(r.Message.Header, r.Message.Data) == id, false, nil
	}
	last, found, none, err := get(msgGetRequest{LastFor: m.Subject})
	if err != nil || found || none {
		return found, err
	}
	seq := uint64(1)
	for range c.maxKeyBacklog + 1 {
		at, found, none, err := get(msgGetRequest{Seq: seq, NextFor: m.Subject})
		if err != nil || found || none || at >= last {
			return found, err
		}
		seq = at + 1
	}
	return false, fmt.Errorf("keylane: key's subject %s held more than its cap of %d jobs", m.Subject, c.maxKeyBacklog)
}

// msgGetRequest and msgGetResponse are the JSON of a stream's message get
// (nats-server's JSApiMsgGetRequest and JSApiMsgGetResponse, the fields
// used).
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error"`
	Message *struct {
		Subject string `json:"subject"`
		Seq     uint64 `json:"seq"`
		Header  []byte `json:"hdrs"`
		Data    []byte `json:"data"`
	} `json:"message"`
}

// jobIDOf returns the ID of the job a stored message carries, from its raw
// headers and body: its Nats-Msg-Id, or its one job's in a batch of one.
func jobIDOf(hdr, body []byte) string {
	if len(hdr) == 0 {
		return ""
	}
	h, err := nats.DecodeHeadersMsg(hdr)
	if err != nil {
		return ""
	}
	if h.Get(wire.HeaderBatch) == "" {
		return h.Get(nats.MsgIdHdr) // a one-job message
	}
	// A batch of one on its key's subject: its job's ID is in the body.
	jobs, err := wire.DecodeBatch(body)
	if err != nil || len(jobs) != 1 {
		return ""
	}
	return jobs[0].ID
}
