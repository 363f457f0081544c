// Command worker runs a keylane worker with the built-in inventory handler.
//
// With no NATS URL it starts an embedded nats-server (JetStream, store on
// disk) on 127.0.0.1:4222 so other workers and clients can join it; with
// --nats (or NATS_URL) it joins an existing server or cluster. SIGINT or
// SIGTERM drains gracefully: in-flight jobs finish and leases are released.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keylane/keylane/internal/workercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
	}
	stop()
	os.Exit(exitCode(err))
}

// exitCode is 0 for success (and -h), 2 for a command line refused, 1 for
// anything else.
func exitCode(err error) int {
	var usage *workercmd.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage):
		return 2
	}
	return 1
}

func run(ctx context.Context, args []string) error {
	c, err := workercmd.Parse(flag.NewFlagSet("worker", flag.ContinueOnError), args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the flags were printed, as asked
		}
		return err
	}
	return workercmd.Run(ctx, c, nil)
}
