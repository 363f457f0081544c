// Command worker runs a keylane worker with the built-in inventory handler.
//
// With no NATS URL it starts an embedded nats-server (JetStream, store on
// disk) on 127.0.0.1:4222 so other workers and clients can join it; with
// --nats (or NATS_URL) it joins an existing server or cluster. SIGINT or
// SIGTERM drains gracefully: in-flight jobs finish and leases are released;
// a second one exits at once.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/workercmd"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is 0 for success (and -h, --version), 2 for a command line
// refused, 1 for anything else.
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

// run parses args and runs the worker until the first SIGINT or SIGTERM,
// then drains it; a second signal ends the process at once
// (cmdutil.SignalContext).
func run(args []string, out io.Writer) error {
	if len(args) == 1 && args[0] == "version" {
		args = []string{"--version"}
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	version := fs.Bool("version", false, "print the command's version and exit")
	c, err := workercmd.Parse(fs, args)
	if *version {
		fmt.Fprintln(out, cmdutil.VersionLine("worker"))
		return nil
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the flags were printed, as asked
		}
		return err
	}
	ctx, stop := cmdutil.SignalContext("worker", c.Worker.Logger)
	defer stop()
	return workercmd.Run(ctx, c, nil)
}
