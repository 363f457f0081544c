package keylane

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestValidateJobID(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "order-42": true, "a.b": true, "A_z=0-9": true, strings.Repeat("x", 256): true,
		"": false, ".a": false, "a.": false, "has space": false, "ü": false, "a/b": false, "a*": false,
		strings.Repeat("x", 257): false,
	} {
		err := ValidateJobID(id)
		if (err == nil) != ok || (err != nil && !errors.Is(err, ErrBadJobID)) {
			t.Errorf("ValidateJobID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

// TestCallReportsStoreFailure checks that Call, which does not wait for
// the stream's ack before waiting for the result, still returns the
// stream's refusal at once instead of waiting for a result that will
// never come.
func TestCallReportsStoreFailure(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	s, err := e.js.Stream(ctx(t), e.topo.Names.Jobs())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 300
	if _, err := e.js.UpdateStream(ctx(t), cfg); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.Call(ctx(t), "k", make([]byte, 400))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || errors.Is(err, ErrNoReply) {
		t.Fatalf("Call of a job the stream refuses: %v, want the stream's error", err)
	}
	if err := e.js.DeleteStream(ctx(t), e.topo.Names.Jobs()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Call(ctx(t), "k", []byte("x")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("Call with no stream: %v, want ErrNoStreamResponse", err)
	}
}
