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

  list                   dead letters, newest first: sequence, job, key, attempts, worker, age, error
                         (--limit, a page; --before SEQ, the next; --json)
  show SEQ | --job ID    one dead letter, its payload included (--json)
  redrive SEQ...|FILTER  submit again as new jobs (the original job ID then answers with the new outcome), then
                         delete them; a batch dead-lettered whole is submitted again job by job
  purge SEQ...|FILTER    delete dead letters

FILTER selects by --key KEY, --error TEXT (any case), --job ID, --older-than D, --newer-than D,
--from SEQ, --before SEQ and --limit N (all that are given must hold); list takes them too.
redrive and purge act on the sequences named, or on what the filters select, or with --all on
every dead letter (filters may narrow --all); with neither they refuse (exit 2). They go oldest
first, print what they will do and do it only with --yes; --dry-run prints it and stops.
A sequence or job with no dead letter: exit 3. Flags may come after the arguments.`

// deadFlags are the flags of each dead-letter command besides the
// connection's and the filters': any other is refused by the flag
// package (exit 2).
var deadFlags = map[string][]string{
	"list":    {"json", "limit"},
	"show":    {"json"},
	"redrive": {"all", "limit", "yes", "dry-run", "progress"},
	"purge":   {"all", "limit", "yes", "dry-run"},
}

// planShown bounds the dead letters a plan lists one by one.
const planShown = 20

// dead runs the dead-letter subcommands on keylane's library API
// (keylane.DeadLetterSpan, DeadLetterAt, Client.Redrive,
// DeleteDeadLetter, PurgeDeadLettersThrough).
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
		forceBars                = new(bool)
		sel                      deadSelection
	)
	if cmd != "show" {
		sel.register(fs, cmd == "list")
	} else {
		fs.StringVar(&sel.job, "job", "", "show the dead letters of this job ID instead of a sequence")
	}
	for _, name := range deadFlags[cmd] {
		switch name {
		case "json":
			fs.BoolVar(&asJSON, "json", false, "print JSON (a list: [] when none)")
		case "limit":
			if cmd == "list" {
				fs.IntVar(&limit, "limit", 100, "list at most this many (a page)")
			} else {
				fs.IntVar(&limit, "limit", 0, "select at most this many dead letters, the oldest of those selected")
			}
		case "all":
			fs.BoolVar(&all, "all", false, "every dead letter (those the filters select, if given)")
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
	filtered := set["limit"] && cmd != "list"
	for _, f := range filterFlags {
		filtered = filtered || set[f]
	}
	seqs, err := seqArgs(cmd, fs.Args())
	if err != nil {
		return err
	}
	if err := sel.check(cmd, set); err != nil {
		return err
	}
	switch {
	case set["limit"] && limit < 1:
		return usagef("dead %s: --limit %d: must be positive", cmd, limit)
	case cmd == "list" && len(seqs) > 0:
		return usagef("dead list: takes no sequence (select with the filters, page with --limit and --before), got %q", fs.Args())
	case cmd == "show" && (len(seqs) > 1 || (len(seqs) == 1) == (sel.job != "")):
		return usagef("dead show: want one dead-letter sequence, or --job ID")
	case (cmd == "redrive" || cmd == "purge") && len(seqs) > 0 && (all || filtered):
		return usagef("dead %s: name sequences, or select with --all or the filters; not both", cmd)
	case (cmd == "redrive" || cmd == "purge") && len(seqs) == 0 && !all && !filtered:
		return usagef("dead %s: nothing selected, nothing done: name the dead-letter sequences, select with --key, --error, --job, --older-than, --newer-than, --from, --before or --limit, or give --all for every dead letter", cmd)
	case yes && dryRun:
		return usagef("dead %s: --yes or --dry-run, not both", cmd)
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }() // the server's reason, not a bare timeout
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	sel.now = time.Now()
	notFound := func(err error) error {
		var none errNoDeadLetter
		if !errors.As(err, &none) {
			return err
		}
		switch {
		case asJSON:
			_ = json.NewEncoder(out).Encode(map[string]any{"found": false, "error": none.Error()})
		case cmd == "redrive" || cmd == "purge":
			fmt.Fprintln(out, none.Error()+" (nothing done)")
		default:
			fmt.Fprintln(out, none.Error())
		}
		return exitNotFound
	}
	switch cmd {
	case "list":
		dls, more, err := sel.scan(ctx, js, c.namespace, true, limit)
		if err != nil {
			return err
		}
		next := ""
		if more {
			next = fmt.Sprintf("more: the next page is --before %d", dls[len(dls)-1].Seq)
		}
		if asJSON {
			if dls == nil {
				dls = []keylane.DeadLetter{}
			}
			if next != "" {
				fmt.Fprintln(errOut, next)
			}
			return json.NewEncoder(out).Encode(dls)
		}
		if len(dls) == 0 {
			fmt.Fprintf(out, "no dead letters selected in namespace %s\n", c.namespace)
			return nil
		}
		tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "seq\tjob\tkey\tattempts\tworker\tage\terror")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Seq, d.JobID, d.Key, d.Attempts, d.Worker, sel.now.Sub(d.Time).Round(time.Second), d.Error)
		}
		tw.Flush()
		if next != "" {
			fmt.Fprintln(out, next)
		}
		return nil
	case "show":
		var dls []keylane.DeadLetter
		if sel.job != "" {
			if dls, _, err = sel.scan(ctx, js, c.namespace, true, 1<<20); err != nil {
				return err
			}
			if len(dls) == 0 {
				return notFound(errNoDeadLetter{fmt.Sprintf("of job %s in namespace %s (never dead-lettered, or redriven, purged or expired after 7 days)", sel.job, c.namespace)})
			}
		} else {
			d, err := deadAt(ctx, js, c.namespace, seqs[0])
			if err != nil {
				return notFound(err)
			}
			dls = append(dls, d)
		}
		for _, d := range dls {
			if asJSON {
				if err := json.NewEncoder(out).Encode(d); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(out, "dead letter %d\n  job %s, key %s, type %q\n  error: %s\n  attempts %d, worker %s, partition %d, job seq %d, fence %d, at %s\n  payload (%d bytes, %d dropped): %q\n",
				d.Seq, d.JobID, d.Key, d.Type, d.Error, d.Attempts, d.Worker, d.Partition, d.JobSeq, d.Fence, d.Time.UTC().Format(time.RFC3339), len(d.Payload), d.PayloadDropped, d.Payload)
		}
		return nil
	}

	// redrive or purge: select, say what will be done, do it only with --yes.
	if cmd == "purge" && len(seqs) == 0 && !filtered {
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
			d, err := deadAt(ctx, js, c.namespace, seq)
			if err != nil {
				return notFound(err)
			}
			dls = append(dls, d)
		}
	} else {
		if !set["limit"] {
			limit = 1 << 20 // a bounded pass: what was dead-lettered when it started
		}
		if dls, _, err = sel.scan(ctx, js, c.namespace, false, limit); err != nil {
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
			return nil, usagef("dead %s: %q is not a dead-letter sequence", cmd, a)
		}
		seqs = append(seqs, seq)
	}
	return seqs, nil
}
