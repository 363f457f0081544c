package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
)

// exitNotFound is the status of keylane state get and keylane job when
// nothing is kept for the key or ID: the answer was read, and it is
// "none" (1 is a failure to read, 2 a usage error).
const exitNotFound = exitError(3)

// stateCmd runs keylane state get KEY: keylane.InspectState, printed.
func stateCmd(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	const usage = `usage: keylane state get KEY [--json] [flags]

  get KEY   a key's decoded state entry: value, last job (sequence, batch index, fence, epoch), revision
            and held outcomes; exit 3 when the key has none`
	if err := subcommand(args, "state", func(c string) bool { return c == "get" }, usage, out, errOut); err != nil {
		return err
	}
	fs := flag.NewFlagSet("state get", flag.ContinueOnError)
	var c conn
	c.register(fs)
	asJSON := fs.Bool("json", false, "print the entry as JSON")
	if err := parse(fs, args[1:], errOut); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("state get: want one key, got %d arguments", fs.NArg())
	}
	key := fs.Arg(0)
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	e, rev, err := keylane.InspectState(ctx, js, c.namespace, key)
	if errors.Is(err, keylane.ErrNoState) {
		why := fmt.Sprintf("key %q has no state entry in namespace %s (no job of it was applied by a reducer, or the entry was deleted)", key, c.namespace)
		if *asJSON {
			return notFoundJSON(out, map[string]any{"Key": key, "found": false, "error": why})
		}
		fmt.Fprintln(out, why)
		return exitNotFound
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(stateJSON{Key: key, Revision: rev, StateEntry: e, Held: len(e.Recent) + 1})
	}
	fmt.Fprintf(out, "key:       %s\nrevision:  %d\nvalue:     %s\nlast job:  %s (seq %d, batch index %d, fence %d, epoch %x)\nresult:    %s\nheld outcomes: %d, oldest first\n",
		key, rev, printable(e.Value), e.JobID, e.Seq, e.Index, e.Fence, e.Epoch, printable(e.Result), len(e.Recent)+1)
	for _, r := range e.Recent {
		fmt.Fprintf(out, "  seq %d  %s  %s\n", r.Seq, r.ID, printable(r.Result))
	}
	fmt.Fprintf(out, "  seq %d  %s  %s\n", e.Seq, e.JobID, printable(e.Result))
	return nil
}

// notFoundJSON is what --json prints when nothing is found: v, an
// object with "found": false and why; the status is exitNotFound.
func notFoundJSON(out io.Writer, v map[string]any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	return exitNotFound
}

// stateJSON is keylane state get --json's output.
type stateJSON struct {
	Key      string
	Revision uint64
	keylane.StateEntry
	// Held counts the outcomes the entry holds: Recent and the last job.
	Held int
}

// jobCmd runs keylane job ID: keylane.InspectJob, printed.
func jobCmd(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("job", flag.ContinueOnError)
	var c conn
	c.register(fs)
	asJSON := fs.Bool("json", false, "print the outcome as JSON")
	key := fs.String("key", "", "the job's key: look in its state entry's held outcomes too (a reducer's job)")
	if err := parse(fs, args, errOut); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(errOut, "usage: keylane job ID [--key KEY] [--json] [flags]")
		return exitError(2)
	}
	id := fs.Arg(0)
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	f, err := keylane.InspectJob(ctx, js, c.namespace, id, *key)
	if errors.Is(err, keylane.ErrNoResult) {
		ttl := "the results bucket's TTL"
		if kv, kerr := js.KeyValue(ctx, keylane.Names{Namespace: c.namespace}.Results()); kerr == nil {
			if st, serr := kv.Status(ctx); serr == nil {
				ttl = st.TTL().String()
				if st.TTL() == 0 {
					ttl = "never (no TTL)"
				}
			}
		}
		where := "results bucket and dead letters"
		if *key != "" {
			where = "results bucket, key " + strconv.Quote(*key) + "'s state and dead letters"
		}
		why := fmt.Sprintf("job %s: not found in namespace %s (%s); kept outcomes expire after %s, held ones leave a key's window after %d newer jobs, dead letters after 7 days; a job without an ID of yours keeps none unless workers run with --results",
			id, c.namespace, where, ttl, keylane.HeldJobs)
		if *asJSON {
			return notFoundJSON(out, map[string]any{"ID": id, "found": false, "error": why})
		}
		fmt.Fprintln(out, why)
		return exitNotFound
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(f)
	}
	fmt.Fprintf(out, "job %s: found in %s\n", id, whereText(f.Where))
	if f.Err != nil {
		fmt.Fprintf(out, "failed: %s\n", f.Error)
	} else {
		fmt.Fprintf(out, "result: %s\n", printable(f.Result))
	}
	if d := f.Dead; d != nil {
		fmt.Fprintf(out, "dead letter %d: key %q, partition %d, %d attempts, worker %s, fence %d, at %s\nreason: %s\n",
			d.Seq, d.Key, d.Partition, d.Attempts, d.Worker, d.Fence, d.Time.Format(time.RFC3339), d.Error)
	}
	return nil
}

func whereText(where string) string {
	switch where {
	case keylane.FoundResults:
		return "the results bucket (by job ID)"
	case keylane.FoundBatch:
		return "the results bucket (its batch's outcomes entry)"
	case keylane.FoundState:
		return "its key's state entry (held outcomes)"
	case keylane.FoundDead:
		return "the dead-letter stream"
	}
	return where
}

// printable quotes b unless it is printable UTF-8 without quotes'
// trouble; "(none)" for nil.
func printable(b []byte) string {
	if b == nil {
		return "(none)"
	}
	if utf8.Valid(b) {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%d bytes: %x", len(b), b)
}
