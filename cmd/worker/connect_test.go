package main

import (
	"fmt"
	"github.com/keylane/keylane/internal/natstest"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// quiet sends the worker's own stderr (flags, logs) to /dev/null for the
// test.
func quiet(t *testing.T) {
	t.Helper()
	stderr := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Stderr = devnull
	t.Cleanup(func() { os.Stderr = stderr; devnull.Close() })
}

// TestConnectErrorHidesPassword: a password in the NATS URL never shows
// in the worker's connect error.
func TestConnectErrorHidesPassword(t *testing.T) {
	quiet(t)
	err := run([]string{"--nats", "nats://ops:s3cret-pw@127.0.0.1:1", "--log-level", "error"}, io.Discard)
	if said := fmt.Sprint(err); err == nil || strings.Contains(said, "s3cret") || !strings.Contains(said, "nats://ops:***@127.0.0.1:1") {
		t.Errorf("worker with a password in --nats: %v; want an error naming nats://ops:***@127.0.0.1:1, without the password", err)
	}
}

// TestNoJetStreamSaysStartWithJS: against a nats-server without
// JetStream, the worker says so and how to start it.
func TestNoJetStreamSaysStartWithJS(t *testing.T) {
	quiet(t)
	s := natstest.StartNoJetStream(t)
	done := make(chan error, 1)
	go func() { done <- run([]string{"--nats", s.ClientURL(), "--log-level", "error"}, io.Discard) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "JetStream") || !strings.Contains(err.Error(), "-js") {
			t.Errorf("worker on a server without JetStream: %v; want it to say JetStream is off and to start nats-server with -js", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop within 30s on a server without JetStream")
	}
}
