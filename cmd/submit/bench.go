package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/keylane/keylane/inventory"
)

// bench runs the hot-key flash sale with request-reply at several buyer
// counts and a fire-and-forget bulk run, in one process run, and prints
// jobs/s and latency percentiles. Every run checks the sale's invariants.
func bench(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c common
	c.register(fs)
	purchases := fs.Int("purchases", 20000, "purchases per run")
	skus := fs.Int("skus", 1, "SKUs (1 = a single hot key)")
	if err := fs.Parse(args); err != nil {
		return exitError(2)
	}
	cl, local, done, err := c.connect(ctx, 0)
	if err != nil {
		return err
	}
	defer done()
	var tr *inventory.Tracker
	if local != nil {
		tr = local.Tracker
		fmt.Fprintf(out, "embedded NATS, %d workers in this process, %d partitions\n", len(local.Workers), cl.Partitions())
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tbuyers\tSKUs\tjobs\tjobs/s\tp50\tp99\tinvariants\t")
	failed := false
	type run struct {
		buyers int
		ff     bool
	}
	for _, r := range []run{{8, false}, {64, false}, {256, false}, {64, true}} {
		cfg := inventory.SaleConfig{SKUs: *skus, Stock: int64(*purchases) / 2, Buyers: r.buyers, Purchases: *purchases, FireAndForget: r.ff, Timeout: 5 * time.Minute}
		v, err := inventory.RunSale(ctx, cl, cfg, tr)
		if err != nil {
			return err
		}
		mode, p50, p99 := "Call", v.P50.String(), v.P99.String()
		if r.ff {
			mode, p50, p99 = "SubmitMany", "-", "-"
		}
		ok := "ok"
		if !v.OK() {
			ok, failed = "FAILED", true
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t\n", mode, r.buyers, *skus, *purchases, v.JobsPerS, p50, p99, ok)
	}
	_ = tw.Flush()
	if failed {
		return exitError(1)
	}
	return nil
}
