package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natsflags"
)

// namespaceCmd runs keylane namespace delete NS: keylane.NamespaceObjects,
// then with --yes keylane.DeleteNamespace.
func namespaceCmd(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	const usage = `usage: keylane namespace delete NS [--yes] [--force] [flags]

  delete NS   delete every stream and bucket of namespace NS (jobs, shards, delays, dead letters,
              leases, members, results, state): its jobs, dead letters and state are gone for good.
              Without --yes it lists them and deletes nothing; while a worker holds a partition
              lease of NS it refuses unless --force (stop the workers first).`
	if err := subcommand(args, "namespace", func(c string) bool { return c == "delete" }, usage, out, errOut); err != nil {
		return err
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
		return fmt.Errorf("namespace delete: name the namespace to delete as the argument (got %d arguments); --namespace is not read", fs.NArg())
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
