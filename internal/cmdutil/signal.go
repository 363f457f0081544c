package cmdutil

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// ForcedExit is the exit status of a command ended by a second signal.
const ForcedExit = 1

// SignalContext returns a context that ends at the first SIGINT or
// SIGTERM, for a graceful stop (a worker's drain), and the function that
// stops listening. A second signal while the command is stopping ends the
// process at once with status ForcedExit, after saying so through log (on
// stderr, after the command's name, when log is nil): an operator who
// presses Ctrl-C twice is not kept waiting for the drain.
func SignalContext(name string, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			const why = "second signal while stopping: exiting now, without finishing the graceful stop (a worker's unacked jobs go to the next owner after their ack wait, its unreleased leases expire after their TTL)"
			if log != nil {
				log.Error(why, "signal", sig.String())
			} else {
				fmt.Fprintf(os.Stderr, "%s: %s: %s\n", name, why, sig)
			}
			os.Exit(ForcedExit)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		<-exited
		cancel()
	}
}
