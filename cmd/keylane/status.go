package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
)

// status prints keylane.Inspect of a namespace, once or every --watch.
func status(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var c conn
	c.register(fs)
	asJSON := fs.Bool("json", false, "print the status as JSON")
	watch := fs.Duration("watch", 0, "print it again every this long until interrupted (0: once)")
	if err := parseFlagsOnly(fs, args, errOut); err != nil {
		return err
	}
	if *watch < 0 {
		return usagef("--watch %s: must not be negative", *watch)
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }() // the server's reason, not a bare timeout
	for {
		st, err := keylane.Inspect(ctx, js, c.namespace)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			if err := enc.Encode(st); err != nil {
				return err
			}
		} else {
			printStatus(out, st, time.Now())
		}
		if *watch == 0 {
			return nil
		}
		t := time.NewTimer(*watch)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func printStatus(out io.Writer, st keylane.Status, now time.Time) {
	epochs := ""
	for i, e := range st.Epochs {
		if i > 0 {
			epochs += ","
		}
		epochs += strconv.FormatUint(e, 16)
	}
	fmt.Fprintf(out, "namespace %s: %d partitions (%s) over %d jobs stream shard(s), replicas %d, epoch %s\n", st.Namespace, st.Partitions, st.Hash, st.Shards, st.Replicas, epochs)
	if st.Delays {
		fmt.Fprintln(out, "delayed jobs: on (WithDelay, WithRunAt)")
	}
	if st.MaxKeyBacklog > 0 {
		fmt.Fprintf(out, "admission: at most %d jobs of one key waiting or running\n", st.MaxKeyBacklog)
	}
	fmt.Fprintf(out, "members (%d): %v\ndead letters: %d\n", len(st.Members), st.Members, st.DeadLetters)
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "partition\towner\tfence\ttenure\tpending\tin flight\tredelivered\tlast active")
	for _, p := range st.Partition {
		owner, tenure, last := p.Owner, "-", "-"
		if owner == "" {
			owner = "(free)"
		}
		if !p.Since.IsZero() {
			tenure = now.Sub(p.Since).Round(time.Second).String()
		}
		if !p.LastActive.IsZero() {
			last = now.Sub(p.LastActive).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%d\t%d\t%s\n", p.Partition, owner, p.Fence, tenure, p.Pending, p.InFlight, p.Redelivered, last)
	}
	tw.Flush()
}
