package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/internal/progress"
)

const deadUsage = `usage: keylane dead <list|show|redrive|purge> [flags]

  list              dead letters, oldest first: sequence, job, key, attempts, worker, error (--limit, --from, --json)
  show SEQ          one dead letter, its payload included (--json)
  redrive SEQ|--all submit again as new jobs (the original job ID then answers with the new outcome) and delete
  purge             delete every dead letter`

// dead runs the dead-letter subcommands on keylane's library API
// (keylane.DeadLetters, DeadLetterAt, Client.Redrive, PurgeDeadLetters).
func dead(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	switch {
	case len(args) == 0:
		fmt.Fprintln(errOut, deadUsage)
		return exitError(2)
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(out, deadUsage)
		return exitError(0)
	case args[0] != "list" && args[0] != "show" && args[0] != "redrive" && args[0] != "purge":
		fmt.Fprintf(errOut, "keylane: unknown dead-letter command %q\n%s\n", args[0], deadUsage)
		return exitError(2)
	}
	fs := flag.NewFlagSet("dead "+args[0], flag.ContinueOnError)
	var c conn
	c.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	limit := fs.Int("limit", 100, "list at most this many")
	from := fs.Uint64("from", 0, "list from this dead-letter sequence on")
	all := fs.Bool("all", false, "redrive every dead letter")
	forceBars := progressFlag(fs)
	if err := parse(fs, args[1:], errOut); err != nil {
		return err
	}
	seqArg := func() (uint64, error) {
		if fs.NArg() != 1 {
			return 0, fmt.Errorf("dead %s: want one dead-letter sequence", args[0])
		}
		seq, err := strconv.ParseUint(fs.Arg(0), 10, 64)
		if err != nil || seq == 0 {
			return 0, fmt.Errorf("dead %s: %q is not a dead-letter sequence", args[0], fs.Arg(0))
		}
		return seq, nil
	}
	if *limit < 1 {
		return fmt.Errorf("--limit %d: must be positive", *limit)
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }() // the server's reason, not a bare timeout
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	switch args[0] {
	case "list":
		dls, err := keylane.DeadLetters(ctx, js, c.namespace, *from, *limit)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(out).Encode(dls)
		}
		tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "seq\tjob\tkey\tattempts\tworker\tage\terror")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Seq, d.JobID, d.Key, d.Attempts, d.Worker, time.Since(d.Time).Round(time.Second), d.Error)
		}
		return tw.Flush()
	case "show":
		seq, err := seqArg()
		if err != nil {
			return err
		}
		d, err := keylane.DeadLetterAt(ctx, js, c.namespace, seq)
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", seq, err)
		}
		if *asJSON {
			return json.NewEncoder(out).Encode(d)
		}
		fmt.Fprintf(out, "dead letter %d\n  job %s, key %s, type %q\n  error: %s\n  attempts %d, worker %s, partition %d, job seq %d, fence %d, at %s\n  payload (%d bytes, %d dropped): %q\n",
			d.Seq, d.JobID, d.Key, d.Type, d.Error, d.Attempts, d.Worker, d.Partition, d.JobSeq, d.Fence, d.Time.UTC().Format(time.RFC3339), len(d.Payload), d.PayloadDropped, d.Payload)
		return nil
	case "redrive":
		cl, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: c.namespace})
		if err != nil {
			return err
		}
		defer cl.Close()
		var dls []keylane.DeadLetter
		if *all {
			if fs.NArg() != 0 {
				return errors.New("dead redrive: --all or one sequence, not both")
			}
			// A bounded pass: what was dead-lettered when it started.
			if dls, err = keylane.DeadLetters(ctx, js, c.namespace, 0, 1<<20); err != nil {
				return err
			}
		} else {
			seq, err := seqArg()
			if err != nil {
				return err
			}
			d, err := keylane.DeadLetterAt(ctx, js, c.namespace, seq)
			if err != nil {
				return fmt.Errorf("dead letter %d: %w", seq, err)
			}
			dls = []keylane.DeadLetter{d}
		}
		bars := &progress.Display{} // one letter: nothing to watch
		var bar *progress.Bar
		if *all && len(dls) > 0 {
			bars = progress.New(errOut, *forceBars)
			bar = bars.Bar("redrive", int64(len(dls)))
		}
		lines := bars.Lines(out)
		failed := 0
		for _, d := range dls {
			id, err := cl.Redrive(ctx, d)
			bar.Add(1)
			if err != nil {
				failed++
				fmt.Fprintf(lines, "dead letter %d (job %s): %v\n", d.Seq, d.JobID, err)
				continue
			}
			fmt.Fprintf(lines, "dead letter %d (job %s) redriven as %s\n", d.Seq, d.JobID, id)
		}
		bars.Wait()
		if failed > 0 {
			return fmt.Errorf("%d of %d dead letters not redriven", failed, len(dls))
		}
		return nil
	case "purge":
		n, err := keylane.PurgeDeadLetters(ctx, js, c.namespace)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "purged %d dead letters of namespace %s\n", n, c.namespace)
		return nil
	}
	return fmt.Errorf("dead %s: not a dead-letter command", args[0]) // checked before connecting
}
