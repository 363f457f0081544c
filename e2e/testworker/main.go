// Command testworker is cmd/worker with the flags only tests need: a hold
// inside each job's critical section, a trace line per job run, the final
// counters in a file, and a payload that kills the process. The e2e tests
// build it and run it as their worker processes; it is not shipped.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/sale"
	"github.com/keylane/keylane/internal/workercmd"
	"github.com/keylane/keylane/inventory"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("testworker", flag.ContinueOnError)
	hold := fs.Duration("hold", 0, "pause inside each job's critical section")
	crashOn := fs.String("crash-on", "", "exit the process at once when a job's payload is exactly this (a job that kills its worker)")
	trace := fs.String("trace", "", "append a JSON line per job run to this file")
	statsFile := fs.String("stats", "", "write the worker's final counters as JSON to this file")
	c, err := workercmd.Parse(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the flags were printed, as asked
		}
		return err
	}
	var tracker *sale.Tracker
	if *trace != "" {
		f, err := os.OpenFile(*trace, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		tracker = sale.NewTracker(f, c.Worker.ID)
	}
	h := &sale.Handler{Inventory: &inventory.Handler{}, Hold: *hold, Tracker: tracker}
	c.Worker.Reducer = h
	if *crashOn != "" {
		c.Worker.Reducer = crashing{h, *crashOn, c.Worker.Logger}
	}
	var stopped func(*keylane.Worker) error
	if *statsFile != "" {
		stopped = func(w *keylane.Worker) error {
			b, _ := json.Marshal(w.Stats())
			return os.WriteFile(*statsFile, b, 0o644)
		}
	}
	ctx, stop := cmdutil.SignalContext("worker", c.Worker.Logger)
	defer stop()
	return workercmd.Run(ctx, c, stopped)
}

// crashing is the inventory reducer, exiting the process on one payload:
// a job that takes down every worker that runs it.
type crashing struct {
	*sale.Handler
	on  string
	log *slog.Logger
}

func (c crashing) Reduce(ctx context.Context, j keylane.Job, cur []byte) ([]byte, []byte, error) {
	if string(j.Payload) == c.on {
		c.log.Error("crashing on purpose", "job_id", j.ID, "attempt", j.Attempt)
		os.Exit(99)
	}
	return c.Handler.Reduce(ctx, j, cur)
}
