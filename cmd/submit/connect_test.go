package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestConnectErrorHidesPassword: a password in the NATS URL never shows
// in what submit prints when it cannot connect.
func TestConnectErrorHidesPassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"send", "--key", "k"}, {"call", "--key", "k"}, {"sale"}, {"bulk"}} {
		var out bytes.Buffer
		err := run(ctx, append(args, "--nats", "nats://ops:s3cret-pw@127.0.0.1:1"), &out, &out)
		said := out.String() + fmt.Sprint(err)
		if err == nil || strings.Contains(said, "s3cret") || !strings.Contains(said, "nats://ops:***@127.0.0.1:1") {
			t.Errorf("submit %q with a password in --nats: %v\n%s\nwant an error naming nats://ops:***@127.0.0.1:1, without the password", args, err, out.String())
		}
	}
}

// TestNoJetStreamSaysStartWithJS: against a nats-server without
// JetStream, submit says so and how to start it.
func TestNoJetStreamSaysStartWithJS(t *testing.T) {
	s := natstest.StartNoJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"send", "--key", "k"}, {"sale", "--purchases", "10"}} {
		var out bytes.Buffer
		err := run(ctx, append(args, "--nats", s.ClientURL(), "--timeout", "10s"), &out, &out)
		if err == nil || !strings.Contains(err.Error(), "JetStream") || !strings.Contains(err.Error(), "-js") {
			t.Errorf("submit %q on a server without JetStream: %v\nwant it to say JetStream is off and to start nats-server with -js", args, err)
		}
	}
}

// TestSaleHidesToken: a token in the URL of a server that accepts it is
// not printed by the sale's first line, which names the server.
func TestSaleHidesToken(t *testing.T) {
	srv := natstest.StartConfig(t, "authorization { token: s3cret-tok }\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://s3cret-tok@", 1)
	js, _ := jetstream.New(natstest.Connect(t, srv, nats.Token("s3cret-tok")))
	if _, err := keylane.Setup(ctx, js, keylane.TopologyConfig{Namespace: "tok", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// No worker runs: the sale stops at its timeout, after its first line.
	err := run(ctx, []string{"sale", "--nats", url, "--namespace", "tok", "--purchases", "10", "--timeout", "1s"}, &out, &out)
	said := out.String() + fmt.Sprint(err)
	if strings.Contains(said, "s3cret") || !strings.Contains(said, "nats://***@127.0.0.1") {
		t.Fatalf("submit sale with a token in --nats printed:\n%s", said)
	}
}
