package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
)

const namespaceUsage = `usage: keylane namespace <list|delete> [flags]

  list        the namespaces on the server: partitions, shards, live workers, jobs waiting, dead letters (--json)
  delete NS   delete every stream and bucket of namespace NS (jobs, shards, delays, dead letters,
              leases, members, results, state): its jobs, dead letters and state are gone for good.
              Without --yes it lists them and deletes nothing; while a worker holds a partition
              lease of NS it refuses unless --force (stop the workers first).`

// namespaceCmd runs keylane namespace list (namespaceList) and keylane
// namespace delete NS: keylane.NamespaceObjects, then with --yes
// keylane.DeleteNamespace.
func namespaceCmd(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	if err := subcommand(args, "namespace", func(c string) bool { return c == "delete" || c == "list" }, namespaceUsage, out, errOut); err != nil {
		return err
	}
	if args[0] == "list" {
		return namespaceList(ctx, args[1:], out, errOut)
	}
	fs := flag.NewFlagSet("namespace delete", flag.ContinueOnError)
	var c conn
	c.register(fs)
	yes := fs.Bool("yes", false, "delete: without, only list what would be deleted")
	force := fs.Bool("force", false, "delete even while workers hold partition leases of the namespace")
	if err := parse(fs, args[1:], errOut); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("namespace delete: name the namespace to delete as the argument (got %d arguments); --namespace is not read", fs.NArg())
	}
	ns := fs.Arg(0)
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	objs, err := keylane.NamespaceObjects(ctx, js, ns)
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		return fmt.Errorf("namespace delete: namespace %s does not exist: no stream or bucket of it found", ns)
	}
	held, err := keylane.LiveLeases(ctx, js, ns)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s: %d streams and buckets:\n", ns, len(objs))
	for _, o := range objs {
		fmt.Fprintln(out, "  "+o)
	}
	if len(held) > 0 {
		fmt.Fprintf(out, "%d partition leases are held by live workers:", len(held))
		for p, w := range held {
			fmt.Fprintf(out, " %s=%s", p, w)
		}
		fmt.Fprintln(out)
		if !*force {
			return fmt.Errorf("namespace delete: nothing deleted: workers hold leases of %s; stop them, or add --force", ns)
		}
	}
	if !*yes {
		return errors.New("namespace delete: nothing deleted; add --yes to delete them")
	}
	deleted, err := keylane.DeleteNamespace(ctx, js, ns, *force)
	for _, d := range deleted {
		fmt.Fprintln(out, "deleted "+d)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s deleted\n", ns)
	return nil
}

// namespaceRow is one namespace of keylane namespace list.
type namespaceRow struct {
	Namespace   string `json:"namespace"`
	Partitions  int    `json:"partitions"`
	Shards      int    `json:"shards"`
	Members     int    `json:"members"`
	Pending     uint64 `json:"pending"`
	DeadLetters uint64 `json:"dead_letters"`
	// Error is why the namespace could not be inspected (its streams
	// are there, the rest is not readable); the other fields are then 0.
	Error string `json:"error,omitempty"`
}

// namespaceList runs keylane namespace list: every jobs stream on the
// server names a namespace (its subjects start with it), each then
// inspected (keylane.Inspect).
func namespaceList(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("namespace list", flag.ContinueOnError)
	var c conn
	c.register(fs)
	asJSON := fs.Bool("json", false, "print JSON: a list, [] when there is none")
	if err := parseFlagsOnly(fs, args, errOut); err != nil {
		return err
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var names []string
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		for _, subject := range info.Config.Subjects {
			ns, _, ok := strings.Cut(subject, ".jobs.")
			if ok && (keylane.Names{Namespace: ns}).Jobs() == info.Config.Name && !slices.Contains(names, ns) {
				names = append(names, ns)
			}
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	slices.Sort(names)
	rows := []namespaceRow{}
	for _, ns := range names {
		row := namespaceRow{Namespace: ns}
		st, err := keylane.Inspect(ctx, js, ns)
		if err != nil {
			row.Error = err.Error()
		} else {
			row.Partitions, row.Shards, row.Members, row.DeadLetters = st.Partitions, st.Shards, len(st.Members), st.DeadLetters
			for _, p := range st.Partition {
				row.Pending += p.Pending
			}
		}
		rows = append(rows, row)
	}
	if *asJSON {
		return json.NewEncoder(out).Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintf(out, "no keylane namespace on %s\n", natsflags.Redact(nc.ConnectedUrl()))
		return nil
	}
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "namespace\tpartitions\tshards\tworkers\tpending\tdead letters")
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t(%s)\n", r.Namespace, r.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", r.Namespace, r.Partitions, r.Shards, r.Members, r.Pending, r.DeadLetters)
	}
	return tw.Flush()
}
