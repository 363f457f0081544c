package keylanepg

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what keylanepg needs of a database: *pgxpool.Pool and *pgx.Conn
// satisfy it. Apply begins its transaction in a batch (pgx's
// Batch.BeginTx), saving BEGIN's round trip. A DB that also lends
// connections, as *pgxpool.Pool does (Acquire), saves one more in
// ApplyPipeline's fast path: its outcomes' record goes with COMMIT.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Schema is the SQL of keylane's own tables, created in the first schema
// of the search_path. Ensure runs it when a table is missing; a role that
// may not create tables needs an owner to run it once, and then these
// rights: SELECT, INSERT, UPDATE on keylane_fences; SELECT, INSERT, DELETE
// on keylane_outcomes (DELETE for Prune).
const Schema = schemaTables + outcomesIndexSQL + ";\n"

// schemaTables is Schema but Prune's index, which Ensure creates once the
// tables' columns are checked.
const schemaTables = `
CREATE TABLE IF NOT EXISTS keylane_fences (
	namespace text NOT NULL,
	partition integer NOT NULL,
	fence bigint NOT NULL,
	PRIMARY KEY (namespace, partition)
);
CREATE TABLE IF NOT EXISTS keylane_outcomes (
	namespace text NOT NULL,
	job_id text NOT NULL,
	key text NOT NULL,
	fence bigint NOT NULL,
	result bytea NOT NULL,
	at timestamptz NOT NULL,
	-- job_id first: a group's look-up (job_id = ANY(…)) probes the index
	-- once per ID, whatever the planner knows of the table.
	PRIMARY KEY (job_id, namespace)
);
`

// tables lists keylane's tables, the columns Apply reads and writes, and
// the rights it needs on each.
var tables = []struct {
	name, columns string
	rights        []string
}{
	{"keylane_fences", "namespace, partition, fence", []string{"SELECT", "INSERT", "UPDATE"}},
	{"keylane_outcomes", "namespace, job_id, key, fence, result, at", []string{"SELECT", "INSERT", "DELETE"}},
}

// ensureLock is the advisory lock key that serializes concurrent Ensure
// calls (workers starting together), so two never race to create a table.
const ensureLock = 0x6b65796c616e65 // "keylane"

// Ensure creates keylane's tables if they are missing and checks that
// they have the columns Apply uses and that the connected role has the
// rights it needs on them. Call it once at start. A missing right is a
// *SchemaError wrapping ErrPrivilege that names the table, the role and the
// grant (or the owner's run of Schema) that would cure it.
func Ensure(ctx context.Context, db DB) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("keylanepg: ensure schema: %w", err)
	}
	defer rollback(ctx, tx.Rollback)
	var role, schema string
	if err := tx.QueryRow(ctx, "SELECT current_user, coalesce(current_schema(), '')").Scan(&role, &schema); err != nil {
		return fmt.Errorf("keylanepg: ensure schema: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(ensureLock)); err != nil {
		return fmt.Errorf("keylanepg: ensure schema: %w", err)
	}
	missing := false
	for _, t := range tables {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.name).Scan(&exists); err != nil {
			return fmt.Errorf("keylanepg: ensure schema: %w", err)
		}
		missing = missing || !exists
	}
	if missing {
		if _, err := tx.Exec(ctx, schemaTables); err != nil {
			if isCode(err, "42501") {
				return &SchemaError{Table: tables[0].name, Role: role, Privilege: true, Err: err,
					Problem: fmt.Sprintf("missing, and role %s may not create tables in schema %q", role, schema),
					Fix:     fmt.Sprintf("run keylanepg.Schema once as the schema's owner and grant %s the rights it lists, or GRANT CREATE ON SCHEMA %s TO %s", role, schema, role)}
			}
			if schema == "" {
				return &SchemaError{Table: tables[0].name, Role: role, Err: err,
					Problem: "missing, and no schema in the search_path to create it in",
					Fix:     "set search_path to a schema the role may create in"}
			}
			return fmt.Errorf("keylanepg: create keylane's tables: %w", err)
		}
	}
	for _, t := range tables {
		// The columns Apply uses, read from the table itself: a table of
		// the same name made for something else fails here, not mid-sale.
		if _, err := tx.Exec(ctx, "SAVEPOINT keylane_check"); err != nil {
			return fmt.Errorf("keylanepg: ensure schema: %w", err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT %s FROM %s LIMIT 0", t.columns, t.name)); err != nil {
			var se *SchemaError
			switch {
			case isCode(err, "42501"):
				se = &SchemaError{Table: t.name, Role: role, Privilege: true, Err: err,
					Problem: fmt.Sprintf("role %s may not read it", role),
					Fix:     fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(t.rights, ", "), t.name, role)}
			case isCode(err, "42703"):
				se = &SchemaError{Table: t.name, Role: role, Err: err,
					Problem: fmt.Sprintf("has not the columns %s", t.columns),
					Fix:     "it is not keylane's table, or an old one: see keylanepg.Schema"}
			default:
				return fmt.Errorf("keylanepg: check table %s: %w", t.name, err)
			}
			return se
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT keylane_check"); err != nil {
			return fmt.Errorf("keylanepg: ensure schema: %w", err)
		}
		// has_table_privilege with several rights is true if any is held:
		// one question a right.
		var lacking []string
		for _, r := range t.rights {
			var ok bool
			if err := tx.QueryRow(ctx, "SELECT has_table_privilege($1, $2)", t.name, r).Scan(&ok); err != nil {
				return fmt.Errorf("keylanepg: check rights on %s: %w", t.name, err)
			}
			if !ok {
				lacking = append(lacking, r)
			}
		}
		if len(lacking) > 0 {
			return &SchemaError{Table: t.name, Role: role, Privilege: true,
				Problem: fmt.Sprintf("role %s lacks %s on it", role, strings.Join(lacking, ", ")),
				Fix:     fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(t.rights, ", "), t.name, role)}
		}
	}
	if err := ensureIndex(ctx, tx, role); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("keylanepg: ensure schema: %w", err)
	}
	return nil
}

// outcomesIndexSQL is Prune's index on keylane_outcomes (in Schema too):
// appended at its right end, as at grows, so it costs a record little.
const outcomesIndexSQL = `CREATE INDEX IF NOT EXISTS keylane_outcomes_at ON keylane_outcomes (namespace, at)`

// ensureIndex creates Prune's index on a keylane_outcomes made before it
// was in Schema. A role that may not (not the table's owner) gets a
// SchemaError naming the statement its owner runs once.
func ensureIndex(ctx context.Context, tx pgx.Tx, role string) error {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass('keylane_outcomes_at') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("keylanepg: ensure schema: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := tx.Exec(ctx, outcomesIndexSQL); err != nil {
		if isCode(err, "42501") {
			return &SchemaError{Table: "keylane_outcomes", Role: role, Privilege: true, Err: err,
				Problem: fmt.Sprintf("has no index keylane_outcomes_at, and role %s may not create it", role),
				Fix:     "have the table's owner run once: " + strings.Replace(outcomesIndexSQL, "CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)}
		}
		return fmt.Errorf("keylanepg: create index keylane_outcomes_at: %w", err)
	}
	return nil
}

// isCode tells whether err is a PostgreSQL error of SQLSTATE code.
func isCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}
