// Command keylane is the operator's tool for a keylane namespace.
//
//	keylane repartition --to 32        # drain, switch to 32 partitions, resume; state is kept
//	keylane adopt --epoch 5f3c…         # carry state over from a re-created jobs stream
//	keylane leaders --spread            # where each jobs stream shard's leader runs; move them apart
//	keylane state get order:42          # a key's state entry and its held outcomes
//	keylane job pay-1                   # a job's outcome by ID, wherever it is kept
//	keylane namespace delete shpo --yes # remove a mistyped namespace's streams and buckets
//	keylane namespace list              # every namespace on the server
//	keylane dead list --error declined --newer-than 1h  # dead letters, newest first, filtered
//	keylane status --context prod       # connect as the nats CLI's saved context "prod"
//
// Exit statuses: 0 done, 1 failed, 2 a usage error (nothing done), 3
// nothing found (state get, job, dead show and a dead letter named by
// sequence).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/natsflags"
	"github.com/keylane/keylane/internal/progress"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, stop := cmdutil.SignalContext("keylane", nil) // a second Ctrl-C exits at once
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	cmdutil.Exit("keylane", err)
}

// exitError is an exit that has already been explained (cmdutil.ExitError).
type exitError = cmdutil.ExitError

const usage = `usage: keylane <command> [flags]

commands:
  repartition  change the partition count: freeze, drain (workers must run), switch, resume; every key's state is kept
  adopt        carry the state of a deleted and re-created jobs stream over (workers hold such keys with ErrEpoch until then)
  leaders      show which server leads each jobs stream shard; --spread moves them onto different servers
  dead         list, show, redrive or purge dead letters (keylane dead -h)
  status       partitions with owner, fence, tenure, backlog, in flight, redeliveries, last activity; members; dead letters (--json, --watch)
  state        get KEY: a key's decoded state entry: value, last job, fence, held outcomes (--json; exit 3 when it has none)
  job          ID: a job's outcome from wherever it is kept: results, its batch's entry, its key's state (--key), dead letters (--json; exit 3 when nowhere)
  namespace    list: the namespaces on the server; delete NS: list, and with --yes delete, every stream and bucket of a namespace (--force while workers hold leases)
  ui           serve the console (status, dead letters with filters, redrive and purge) on 127.0.0.1:7781; needs no worker
  version      the command's version (also --version)

run "keylane <command> -h" for flags. Exit status: 0 done, 1 failed, 2 a usage error (nothing done),
3 nothing found (state get, job, dead show; the read worked). Every command takes --context NAME
(env NATS_CONTEXT): a natscli context, ~/.config/nats/context/NAME.json; flags given win over it.`

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(errOut, usage)
		return exitError(2)
	}
	switch args[0] {
	case "repartition":
		return repartition(ctx, args[1:], out, errOut)
	case "adopt":
		return adopt(ctx, args[1:], out, errOut)
	case "leaders":
		return leaders(ctx, args[1:], out, errOut)
	case "batches":
		return errBatchesGone
	case "status":
		return status(ctx, args[1:], out, errOut)
	case "dead":
		return dead(ctx, args[1:], out, errOut)
	case "state":
		return stateCmd(ctx, args[1:], out, errOut)
	case "job":
		return jobCmd(ctx, args[1:], out, errOut)
	case "namespace":
		return namespaceCmd(ctx, args[1:], out, errOut)
	case "ui":
		return ui(ctx, args[1:], out, errOut)
	case "version", "--version", "-version":
		fmt.Fprintln(out, cmdutil.VersionLine("keylane"))
		return nil
	case "-h", "--help", "help":
		fmt.Fprintln(out, usage)
		return nil
	}
	fmt.Fprintf(errOut, "keylane: unknown command %q\n%s\n", args[0], usage)
	return exitError(2)
}

// subcommand checks args[0], a command's subcommand: nil when known
// says it is one; otherwise the usage (on out for -h, exit 0; on errOut,
// exit 2, naming what kind of command was unknown).
func subcommand(args []string, kind string, known func(string) bool, usage string, out, errOut io.Writer) error {
	switch {
	case len(args) == 0:
		fmt.Fprintln(errOut, usage)
		return exitError(2)
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(out, usage)
		return exitError(0)
	case !known(args[0]):
		fmt.Fprintf(errOut, "keylane: unknown %s command %q\n%s\n", kind, args[0], usage)
		return exitError(2)
	}
	return nil
}

// usagef is a usage error: exit 2, nothing done.
var usagef = cmdutil.Usagef

// parse parses a command's flags: cmdutil.Parse.
func parse(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	return cmdutil.Parse(fs, args, errOut)
}

// parseFlagsOnly is parse for a command that takes no arguments: one
// given is refused rather than ignored.
func parseFlagsOnly(fs *flag.FlagSet, args []string, errOut io.Writer) error {
	if err := parse(fs, args, errOut); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("%s takes flags only, not %q", fs.Name(), fs.Args())
	}
	return nil
}

type conn struct {
	url, namespace string
	auth           *natsflags.Auth
	fs             *flag.FlagSet // to tell the flags given from a --context's settings
}

func (c *conn) register(fs *flag.FlagSet) {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	fs.StringVar(&c.url, "nats", url, "NATS URL (env NATS_URL)")
	fs.StringVar(&c.namespace, "namespace", cmdutil.Namespace(), "keylane namespace (env KEYLANE_NAMESPACE)")
	c.auth = natsflags.Register(fs)
	c.fs = fs
}

// progressFlag registers --progress on a command with long work, whose
// bars go to stderr when it is a terminal, or always with the flag.
func progressFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("progress", false, "draw progress bars on stderr even when it is not a terminal")
}

func (c *conn) open() (*nats.Conn, jetstream.JetStream, error) {
	if err := c.auth.UseContext(c.fs, "nats", &c.url); err != nil {
		return nil, nil, err
	}
	auth, err := c.auth.Options()
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(c.url, append([]nats.Option{nats.Name("keylane-cli"), nats.Timeout(5 * time.Second)}, auth...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", natsflags.Redact(c.url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// repartitionFunc is keylane.Repartition; a test wraps it to hold the
// workers until the drain has counted its jobs.
var repartitionFunc = keylane.Repartition

func repartition(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("repartition", flag.ContinueOnError)
	var c conn
	c.register(fs)
	forceBars := progressFlag(fs)
	to := fs.Int("to", 0, "the new partition count (required)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the workers to drain the old stream; if it passes, nothing changes")
	if err := parseFlagsOnly(fs, args, errOut); err != nil {
		return err
	}
	if *to <= 0 || *timeout <= 0 {
		return usagef("repartition: --to must be a positive partition count and --timeout positive")
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	before, err := keylane.Open(ctx, js, c.namespace, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s: %d partitions -> %d; freezing, draining\n", c.namespace, before.Partitions, *to)
	bars := progress.New(errOut, *forceBars)
	var drained *progress.Bar
	var total uint64
	last := time.Time{}
	err = repartitionFunc(ctx, js, c.namespace, *to, func(left uint64) {
		if bars.Active() {
			// The first count is the drain's total; more (jobs stored
			// just before the freeze) grows it.
			if drained == nil && left > 0 {
				total = left
				drained = bars.Bar("drain", int64(total))
			}
			if left > total {
				total = left
				drained.SetTotal(int64(total))
			}
			drained.Set(int64(total - left))
			return
		}
		if time.Since(last) >= time.Second || left == 0 {
			fmt.Fprintf(out, "  %d jobs left to drain\n", left)
			last = time.Now()
		}
	})
	bars.Wait()
	if err != nil {
		return err
	}
	after, err := keylane.Open(ctx, js, c.namespace, *to)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s: %d partitions, epoch %x (adopts %x); workers reload within a lease TTL; re-open clients\n", c.namespace, after.Partitions, after.Epoch, after.Adopted)
	return nil
}

func adopt(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("adopt", flag.ContinueOnError)
	var c conn
	c.register(fs)
	epoch := fs.String("epoch", "", "the old jobs stream's epoch, in hex, as the workers' ErrEpoch log names it (required)")
	if err := parseFlagsOnly(fs, args, errOut); err != nil {
		return err
	}
	e, err := strconv.ParseUint(*epoch, 16, 64)
	if err != nil || e == 0 {
		return usagef("adopt: --epoch %q is not a hex epoch", *epoch)
	}
	nc, js, err := c.open()
	if err != nil {
		return err
	}
	defer nc.Close()
	defer func() { err = natsflags.Refused(nc, err) }()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := keylane.AdoptEpoch(ctx, js, c.namespace, e); err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s adopts epoch %x: keys written under it run again\n", c.namespace, e)
	return nil
}

// errBatchesGone answers the removed "keylane batches": every job now
// travels in a batch message, and every worker reads them, so there is
// nothing to turn on or off (before, turning it on under workers that did
// not read batches made them step down and exit).
var errBatchesGone = errors.New("keylane batches was removed: every job travels in a batch message and every worker reads them, so there is nothing to turn on or off")

func leaders(ctx context.Context, args []string, out, errOut io.Writer) (err error) {
	fs := flag.NewFlagSet("leaders", flag.ContinueOnError)
	var c conn
	c.register(fs)
	spread := fs.Bool("spread", false, "move shard leaders so no server leads more than its share (a preferred-server step-down per move)")
	shards := fs.Int("stream-shards", 0, "the shard count you expect; another count than the namespace's is refused (0: any)")
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
	meta, err := keylane.Open(ctx, js, c.namespace, 0)
	if err != nil {
		return err
	}
	if *shards != 0 && *shards != meta.Shards {
		return fmt.Errorf("%w: namespace %s has %d, --stream-shards %d", keylane.ErrShardsMismatch, c.namespace, meta.Shards, *shards)
	}
	var ls []keylane.ShardLeader
	if *spread {
		ls, err = keylane.SpreadLeaders(ctx, js, c.namespace)
	} else {
		ls, err = keylane.ShardLeaders(ctx, js, c.namespace)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "namespace %s: %d partitions over %d jobs stream shards\n", c.namespace, meta.Partitions, meta.Shards)
	for _, l := range ls {
		leader := l.Leader
		if leader == "" {
			leader = "(none)"
		}
		fmt.Fprintf(out, "  shard %d %s: leader %s, followers %v\n", l.Shard, l.Stream, leader, l.Followers)
	}
	return nil
}
