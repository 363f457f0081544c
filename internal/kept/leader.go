package kept

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoEntry is a leader get's "no message" (the key was never written,
// or its entries expired).
var ErrNoEntry = errors.New("keylane: no entry")

// StoredMsg is a message as a leader get returns it.
type StoredMsg struct {
	Subject string      `json:"subject"`
	Seq     uint64      `json:"seq"`
	Hdrs    []byte      `json:"hdrs"`
	Data    []byte      `json:"data"`
	Header  nats.Header `json:"-"`
}

// LeaderGet reads the last message on subject (a wildcard: the newest of
// those it matches) of stream with a get its leader answers
// ($JS.API.STREAM.MSG.GET, never a direct get, which any replica answers
// from what it has applied): it cannot miss a message the stream
// acknowledged before the request. It returns ErrNoEntry when there is
// none.
func LeaderGet(ctx context.Context, nc *nats.Conn, stream, subject string) (*StoredMsg, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *StoredMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("keylane: bad answer to a get on %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, ErrNoEntry
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("keylane: a get on %s answered no message", stream)
	}
	sm := resp.Message
	if len(sm.Hdrs) > 0 {
		if sm.Header, err = nats.DecodeHeadersMsg(sm.Hdrs); err != nil {
			return nil, fmt.Errorf("keylane: a get on %s answered bad headers: %w", stream, err)
		}
	}
	return sm, nil
}
