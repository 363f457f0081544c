package natserr

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A stream's ack read by hand: a publish whose ack comes to an inbox of
// the caller's own (the client's Call, the worker's atomic batches)
// rather than through jetstream's PublishMsg.

// AckError returns the error a stream ack carries, or nil for a good
// ack, and whether the ack says the job was a duplicate (stored earlier
// under this ID).
func AckError(m *nats.Msg) (dup bool, err error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return false, jetstream.ErrNoStreamResponse
	}
	hasErr, hasDup := bytes.Contains(m.Data, []byte(`"error"`)), bytes.Contains(m.Data, []byte(`"duplicate"`))
	if !hasErr && !hasDup {
		return false, nil
	}
	var resp struct {
		Error     *jetstream.APIError `json:"error"`
		Duplicate bool                `json:"duplicate"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Errorf("bad stream ack %q: %w", m.Data, err)
	}
	if resp.Error != nil {
		return false, resp.Error
	}
	return resp.Duplicate, nil
}
