// Command keylane-pg is a keylane worker you deploy, not write: it joins
// an existing NATS server or cluster (--nats, with the credential, TLS
// and namespace flags of cmd/worker) and an existing PostgreSQL database
// (--postgres), and applies the jobs it owns with SQL statements from a
// file (--sql; the format is package sqlfile's): a job's type names its
// statements, its payload's JSON fields bind to their parameters, and its
// result is the rows they return, as JSON. Each partition's jobs apply
// through keylanepg: fenced, exactly once, a failing job alone.
//
//	keylane-pg --nats nats://nats-1:4222 --namespace shop \
//	  --postgres 'postgres://shop@db/shop?pool_max_conns=20' --sql shop.json
//
// At start it reads the file, connects, prepares every statement against
// the database (sqlfile's Check), and creates keylane's two tables if
// missing (keylanepg.Ensure): a fault of the command line or of the file
// (an unknown parameter, a field no statement binds, SQL the server will
// not prepare) is printed with where it is, and the command exits 2
// before anything runs. It never creates the file's tables: they are the
// shop's (pg/cmd/keylane-pg/example has a schema and a file for it).
//
// SIGINT or SIGTERM drains gracefully, as cmd/worker does; exit 0 then,
// 2 for a command line or file refused, 1 for anything else. It is a
// command of the pg module because keylane's module must not depend on
// pgx.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane/internal/cmdutil"
	"github.com/keylane/keylane/internal/workercmd"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/sqlfile"
)

func main() {
	err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "keylane-pg:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is 0 for success (and -h), 2 for a command line or SQL file
// refused, 1 for anything else.
func exitCode(err error) int {
	var usage *workercmd.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage), errors.Is(err, sqlfile.ErrInvalid):
		return 2
	}
	return 1
}

// config is what keylane-pg adds to the worker command's flags.
type config struct {
	postgres, sql string
	idle          time.Duration
}

func run(args []string) error {
	fs := flag.NewFlagSet("keylane-pg", flag.ContinueOnError)
	var pc config
	// The worker command's Parse sets these from the variables their help
	// names, through the flags' own parsers, as it does its own.
	fs.StringVar(&pc.postgres, "postgres", "", "PostgreSQL URL, e.g. postgres://user@host/db?pool_max_conns=20 (pgxpool's settings; give pool_max_conns at least the partitions this worker may own) (env DATABASE_URL)")
	fs.StringVar(&pc.sql, "sql", "", "the SQL file: job types, their fields and statements (JSON; see package sqlfile) (env KEYLANE_SQL)")
	fs.DurationVar(&pc.idle, "idle-timeout", 0, "the database ends a transaction idle this long (a paused owner's, so its successor goes on); below --lease-ttl. Default: half the lease TTL (env KEYLANE_PG_IDLE_TIMEOUT)")
	c, err := workercmd.Parse(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the flags were printed, as asked
		}
		return err
	}
	if err := checkFlags(fs, &c, &pc); err != nil {
		return &workercmd.UsageError{Err: err}
	}
	file, err := sqlfile.Load(pc.sql)
	if err != nil {
		if !errors.Is(err, sqlfile.ErrInvalid) {
			return &workercmd.UsageError{Err: fmt.Errorf("--sql: %w", err)}
		}
		return err
	}
	ctx, stop := cmdutil.SignalContext("keylane-pg", c.Worker.Logger)
	defer stop()
	pcfg, err := pgxpool.ParseConfig(pc.postgres)
	if err != nil {
		return &workercmd.UsageError{Err: fmt.Errorf("--postgres: %w", err)}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("--postgres: %w", err)
	}
	defer pool.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	// The file first: refused, it leaves the database as it found it.
	err = file.Check(sctx, pool)
	if err != nil {
		err = fmt.Errorf("%s: %w", pc.sql, err)
	} else {
		err = keylanepg.Ensure(sctx, pool)
	}
	cancel()
	if err != nil {
		return err
	}
	c.Worker.Applier = &keylanepg.Applier{DB: pool, Set: file, IdleTimeout: pc.idle}
	c.Worker.Logger.Info("applying jobs with SQL", "sql", pc.sql, "types", file.Types(), "database", pcfg.ConnConfig.Host+"/"+pcfg.ConnConfig.Database)
	return workercmd.Run(ctx, c, nil)
}

// checkFlags checks keylane-pg's own flags and sets what follows from
// the worker's.
func checkFlags(fs *flag.FlagSet, c *workercmd.Config, pc *config) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case c.URL == "":
		// An embedded server per process would give each worker its own
		// leases and fences over one database.
		return errors.New("--nats (env NATS_URL) is required: keylane-pg joins an existing NATS server or cluster")
	case pc.postgres == "":
		return errors.New("--postgres (env DATABASE_URL) is required: the database the jobs apply to")
	case pc.sql == "":
		return errors.New("--sql (env KEYLANE_SQL) is required: the file of the jobs' statements")
	}
	for _, f := range []string{"listen", "data", "sync-always"} {
		if set[f] {
			return fmt.Errorf("--%s is for an embedded server, and keylane-pg joins the one --nats names", f)
		}
	}
	ttl := c.Worker.Topology.LeaseTTL
	switch {
	case pc.idle == 0:
		pc.idle = ttl / 2
	case pc.idle < 0 || pc.idle >= ttl:
		return fmt.Errorf("--idle-timeout %s: want it positive and below --lease-ttl %s, so that a paused owner's transaction ends before its successor waits on it", pc.idle, ttl)
	}
	if !set["concurrency"] {
		c.Worker.Concurrency = 0 // keylane's default with an Applier (DefaultApplierConcurrency)
	}
	return nil
}
