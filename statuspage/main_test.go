package statuspage_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The in-process nats-server keeps a few process-wide goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func2"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*ipQueue[...]).popOne"),
	)
}
