package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
)

// TestConnectErrorHidesPassword: a password (or token) in the NATS URL
// never shows in what keylane prints when it cannot connect; the user
// name and host do, with the secret as ***.
func TestConnectErrorHidesPassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct{ url, want string }{
		{"nats://ops:s3cret-pw@127.0.0.1:1", "nats://ops:***@127.0.0.1:1"},
		{"nats://s3cret-tok@127.0.0.1:1", "nats://***@127.0.0.1:1"},
		{"nats://127.0.0.1:1,nats://ops:s3cret-pw@127.0.0.1:2", "nats://ops:***@127.0.0.1:2"},
	} {
		var out bytes.Buffer
		err := run(ctx, []string{"status", "--nats", tc.url}, &out, &out)
		said := out.String() + fmt.Sprint(err)
		if err == nil || strings.Contains(said, "s3cret") || !strings.Contains(said, tc.want) {
			t.Errorf("keylane status --nats %s: %v\n%s\nwant an error naming %s, without the secret", tc.url, err, out.String(), tc.want)
		}
	}
}

// TestNoJetStreamSaysStartWithJS: against a nats-server without
// JetStream, keylane says that is the trouble and how to start it,
// instead of a bare "no responders available".
func TestNoJetStreamSaysStartWithJS(t *testing.T) {
	srv := natstest.StartNoJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{"status"}, {"dead", "list"}, {"leaders"}} {
		var out bytes.Buffer
		err := run(ctx, append(args, "--nats", srv.ClientURL()), &out, &out)
		if err == nil || !strings.Contains(err.Error(), "JetStream") || !strings.Contains(err.Error(), "-js") {
			t.Errorf("keylane %q on a server without JetStream: %v\nwant it to say JetStream is off and to start nats-server with -js", args, err)
		}
	}
}
