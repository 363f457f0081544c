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
	"github.com/nats-io/nats.go/jetstream"
)

const deadUsage = `usage: keylane dead <list|show|redrive|purge> [flags]

  list                   dead letters, oldest first: sequence, job, key, attempts, worker, error (--from, --limit, --json)
  show SEQ               one dead letter, its payload included (--json)
  redrive SEQ...|--all   submit again as new jobs (the original job ID then answers with the new outcome), then delete them;
                         a batch dead-lettered whole is submitted again job by job
  purge SEQ...|--all     delete dead letters

redrive and purge act on the sequences named, or with --all on every dead letter, or on those --from
and --limit select (with or without --all). They print what they will do and do it only with --yes;
--dry-run prints it and stops. Flags may come after the arguments.`

// deadFlags are the flags of each dead-letter command besides the
// connection's: any other is refused by the flag package (exit 2).
var deadFlags = map[string][]string{
	"list":    {"json", "limit", "from"},
	"show":    {"json"},
	"redrive": {"all", "from", "limit", "yes", "dry-run", "progress"},
	"purge":   {"all", "from", "limit", "yes", "dry-run"},
}

// planShown bounds the dead letters a plan lists one by one.
const planShown = 20

// dead runs the dead-letter subcommands on keylane's library API
// (keylane.DeadLetters, DeadLetterAt, Client.Redrive, DeleteDeadLetter,
// PurgeDeadLettersThrough).
func dead(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	if err := subcommand(args, "dead-letter", func(c string) bool { return deadFlags[c] != nil }, deadUsage, out, errOut); err != nil {
		return err
	}
	cmd := args[0]
	fs := flag.NewFlagSet("dead "+cmd, flag.ContinueOnError)
	var c conn
	c.register(fs)
	var (
		asJSON, all, yes, dryRun bool
		limit                    int
		from                     uint64
		forceBars                = new(bool)
	)
	for _, name := range deadFlags[cmd] {
		switch name {
		case "json":
			fs.BoolVar(&asJSON, "json", false, "print JSON")
		case "limit":
			if cmd == "list" {
				fs.IntVar(&limit, "limit", 100, "list at most this many")
			} else {
				fs.IntVar(&limit, "limit", 0, "select at most this many dead letters (from --from on)")
			}
		case "from":
			fs.Uint64Var(&from, "from", 0, "start at this dead-letter sequence")
		case "all":
			fs.BoolVar(&all, "all", false, "every dead letter (those --from and --limit select, if given)")
		case "yes":
			fs.BoolVar(&yes, "yes", false, "do it: without, "+cmd+" only prints what it would do")
		case "dry-run":
			fs.BoolVar(&dryRun, "dry-run", false, "print what "+cmd+" would do, and stop")
		case "progress":
			forceBars = progressFlag(fs)
		}
	}
	if err := parse(fs, args[1:], errOut); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	seqs, err := seqArgs(cmd, fs.Args())
	if err != nil {
		return err
	}
	switch {
	case set["limit"] && limit < 1:
		return fmt.Errorf("dead %s: --limit %d: must be positive", cmd, limit)
	case cmd == "list" && len(seqs) > 0:
		return fmt.Errorf("dead list: takes no sequence (use --from and --limit), got %q", fs.Args())
	case cmd == "show" && len(seqs) != 1:
		return errors.New("dead show: want one dead-letter sequence")
	case (cmd == "redrive" || cmd == "purge") && len(seqs) > 0 && (all || set["from"] || set["limit"]):
		return fmt.Errorf("dead %s: name sequences, or select with --all, --from and --limit; not both", cmd)
	case (cmd == "redrive" || cmd == "purge") && len(seqs) == 0 && !all && !set["from"] && !set["limit"]:
		return fmt.Errorf("dead %s: name the dead-letter sequences, or --all (with --from and --limit to select some)", cmd)
	case yes && dryRun:
		return fmt.Errorf("dead %s: --yes or --dry-run, not both", cmd)
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }() // the server's reason, not a bare timeout
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	switch cmd {
	case "list":
		dls, err := keylane.DeadLetters(ctx, js, c.namespace, from, limit)
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(out).Encode(dls)
		}
		tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "seq\tjob\tkey\tattempts\tworker\tage\terror")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Seq, d.JobID, d.Key, d.Attempts, d.Worker, time.Since(d.Time).Round(time.Second), d.Error)
		}
		return tw.Flush()
	case "show":
		d, err := keylane.DeadLetterAt(ctx, js, c.namespace, seqs[0])
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", seqs[0], err)
		}
		if asJSON {
			return json.NewEncoder(out).Encode(d)
		}
		fmt.Fprintf(out, "dead letter %d\n  job %s, key %s, type %q\n  error: %s\n  attempts %d, worker %s, partition %d, job seq %d, fence %d, at %s\n  payload (%d bytes, %d dropped): %q\n",
			d.Seq, d.JobID, d.Key, d.Type, d.Error, d.Attempts, d.Worker, d.Partition, d.JobSeq, d.Fence, d.Time.UTC().Format(time.RFC3339), len(d.Payload), d.PayloadDropped, d.Payload)
		return nil
	}

	// redrive or purge: select, say what will be done, do it only with --yes.
	if cmd == "purge" && len(seqs) == 0 && !set["from"] && !set["limit"] {
		// Every dead letter: one purge through the last one seen now,
		// whatever is dead-lettered meanwhile.
		n, first, last, err := keylane.DeadLetterSpan(ctx, js, c.namespace)
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintf(out, "namespace %s has no dead letters: nothing to purge\n", c.namespace)
			return nil
		}
		fmt.Fprintf(out, "will purge the %d dead letters of namespace %s (sequences %d to %d)\n", n, c.namespace, first, last)
		if err := confirmed(cmd, yes, dryRun, out); err != nil || dryRun {
			return err
		}
		if err := keylane.PurgeDeadLettersThrough(ctx, js, c.namespace, last); err != nil {
			return err
		}
		fmt.Fprintf(out, "purged %d dead letters of namespace %s\n", n, c.namespace)
		return nil
	}
	var dls []keylane.DeadLetter
	if len(seqs) > 0 {
		for _, seq := range seqs {
			d, err := keylane.DeadLetterAt(ctx, js, c.namespace, seq)
			if err != nil {
				return fmt.Errorf("dead letter %d: %w (nothing done)", seq, err)
			}
			dls = append(dls, d)
		}
	} else {
		if !set["limit"] {
			limit = 1 << 20 // a bounded pass: what was dead-lettered when it started
		}
		if dls, err = keylane.DeadLetters(ctx, js, c.namespace, from, limit); err != nil {
			return err
		}
	}
	if len(dls) == 0 {
		fmt.Fprintf(out, "no dead letters of namespace %s selected: nothing to %s\n", c.namespace, cmd)
		return nil
	}
	fmt.Fprintf(out, "will %s %d dead letters of namespace %s:\n", cmd, len(dls), c.namespace)
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  seq\tjob\tkey\terror")
	for _, d := range dls[:min(len(dls), planShown)] {
		key := d.Key
		if d.IsBatch() {
			key = "(a batch)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", d.Seq, d.JobID, key, d.Error)
	}
	tw.Flush()
	if len(dls) > planShown {
		fmt.Fprintf(out, "  … and %d more, to sequence %d\n", len(dls)-planShown, dls[len(dls)-1].Seq)
	}
	if cmd == "redrive" {
		planBatches(out, dls[:min(len(dls), planShown)])
	}
	if err := confirmed(cmd, yes, dryRun, out); err != nil || dryRun {
		return err
	}
	if cmd == "purge" {
		failed := 0
		for _, d := range dls {
			if err := keylane.DeleteDeadLetter(ctx, js, c.namespace, d.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				failed++
				fmt.Fprintf(out, "dead letter %d: %v\n", d.Seq, err)
			}
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d dead letters not purged", failed, len(dls))
		}
		fmt.Fprintf(out, "purged %d dead letters of namespace %s\n", len(dls), c.namespace)
		return nil
	}
	cl, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: c.namespace})
	if err != nil {
		return err
	}
	defer cl.Close()
	bars := &progress.Display{} // letters named one by one: nothing to watch
	var bar *progress.Bar
	if len(seqs) == 0 {
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
		if jobs, _ := d.RedriveJobs(); d.IsBatch() && len(jobs) > 0 {
			fmt.Fprintf(lines, "dead letter %d (batch %s, %d jobs) redriven as:\n", d.Seq, d.JobID, len(jobs))
			for _, j := range jobs {
				fmt.Fprintf(lines, "  job %d (key %s) as %s\n", j.Index, j.Key, j.ID)
			}
			continue
		}
		fmt.Fprintf(lines, "dead letter %d (job %s) redriven as %s\n", d.Seq, d.JobID, id)
	}
	bars.Wait()
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters not redriven", failed, len(dls))
	}
	return nil
}

// planBatches prints, for each batch message dead-lettered whole among
// dls, the jobs a redrive submits (DeadLetter.RedriveJobs), or why it
// would submit none.
func planBatches(out io.Writer, dls []keylane.DeadLetter) {
	for _, d := range dls {
		if !d.IsBatch() {
			continue
		}
		jobs, err := d.RedriveJobs()
		if err != nil {
			fmt.Fprintf(out, "dead letter %d is a batch dead-lettered whole: %v\n", d.Seq, err)
			continue
		}
		fmt.Fprintf(out, "dead letter %d is a batch dead-lettered whole: a batch of %d jobs, each submitted again to its key's partition:\n", d.Seq, len(jobs))
		for _, j := range jobs[:min(len(jobs), planShown)] {
			fmt.Fprintf(out, "  job %d  key %s  type %q  %d bytes  as %s\n", j.Index, j.Key, j.Type, len(j.Payload), j.ID)
		}
		if len(jobs) > planShown {
			fmt.Fprintf(out, "  … and %d more jobs\n", len(jobs)-planShown)
		}
	}
}

// confirmed ends a destructive command that was only to show its plan:
// nil with --yes (go on) or --dry-run (the caller stops), else an error
// saying nothing was done.
func confirmed(cmd string, yes, dryRun bool, out io.Writer) error {
	switch {
	case yes:
		return nil
	case dryRun:
		fmt.Fprintln(out, "dry run: nothing done")
		return nil
	}
	return fmt.Errorf("dead %s: nothing done; add --yes to do it (or --dry-run to only see it)", cmd)
}

// seqArgs parses dead-letter sequences given as arguments.
func seqArgs(cmd string, args []string) ([]uint64, error) {
	seqs := make([]uint64, 0, len(args))
	for _, a := range args {
		seq, err := strconv.ParseUint(a, 10, 64)
		if err != nil || seq == 0 {
			return nil, fmt.Errorf("dead %s: %q is not a dead-letter sequence", cmd, a)
		}
		seqs = append(seqs, seq)
	}
	return seqs, nil
}
