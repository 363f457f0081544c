package keylane

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A stream's refusal reads "nats: API error …" once: nats.go puts its own
// "nats: " before the API error's, and keylane passes it on without the
// repeat, still errors.As a *jetstream.APIError.
func TestPublishRefusalSaysNatsOnce(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	s := e.topo.Streams[0]
	sc := s.CachedInfo().Config
	sc.MaxMsgs, sc.Discard = 1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Submit(ctx(t), "k", nil); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.Submit(ctx(t), "k", nil)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || strings.Contains(err.Error(), "nats: nats:") {
		t.Fatalf("submit to a full stream: %v; want an APIError said with one \"nats:\"", err)
	}
}
