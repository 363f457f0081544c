package natsflags

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoJetStream is the error of a NATS server (or account) without
// JetStream: every JetStream request then ends "no responders
// available", which says nothing of the cause.
var ErrNoJetStream = errors.New("no JetStream: the NATS server runs without it (start it with -js: nats-server -js, or \"jetstream {}\" in its configuration), or JetStream is not enabled for this account")

// CheckJetStream asks the server behind nc for the account's JetStream
// information and returns an error wrapping ErrNoJetStream, naming the
// server, when the answer is that there is none (JetStream not enabled,
// or no JetStream answering at all). Any other outcome returns nil,
// a refused or timed-out request included: a user may lack the
// permission for $JS.API.INFO, and the caller's own requests say more
// then.
func CheckJetStream(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	if noJetStream(err) {
		return fmt.Errorf("%s: %w", Redact(nc.ConnectedUrl()), ErrNoJetStream)
	}
	return nil
}

// noJetStream reports whether err is how nats.go answers a JetStream
// request where no JetStream is.
func noJetStream(err error) bool {
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrJetStreamNotEnabledForAccount)
}

// maybeNoJetStream reports whether err could be a JetStream request
// where there is no JetStream: worth asking CheckJetStream.
func maybeNoJetStream(err error) bool {
	return noJetStream(err) || errors.Is(err, jetstream.ErrNoStreamResponse)
}
