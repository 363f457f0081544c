package sqlfile

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	keylanepg "github.com/keylane/keylane/pg"
)

// Check prepares every statement of f against db, in a transaction of
// its own that it rolls back, so that nothing runs: a statement the server
// will not prepare (a syntax error, an unknown table or column, a
// parameter whose type it cannot infer, several statements in one
// string) is reported with the server's error. It also checks what only
// the server knows: in a set type, every parameter is an array; the
// statement that makes a type's result returns columns, no name twice,
// and in a set type one named job_id. Every fault found is reported, each
// naming its job type and statement, joined in one error with
// ErrInvalid; an error without it (the database unreachable) is not the
// file's.
func (f *File) Check(ctx context.Context, db keylanepg.DB) error {
	var errs []error
	for _, name := range f.Types() {
		jt := f.types[name]
		for i, st := range jt.stmts {
			err := jt.check(ctx, db, st, i == len(jt.stmts)-1)
			var fe fileError
			switch {
			case errors.As(err, &fe):
				errs = append(errs, fmt.Errorf("job type %q: statement %d: %w", name, st.n, err))
			case err != nil:
				return fmt.Errorf("sqlfile: checking job type %q, statement %d: %w", name, st.n, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	return nil
}

// fileError is a fault of the file that Check found.
type fileError struct{ err error }

func (e fileError) Error() string { return e.err.Error() }
func (e fileError) Unwrap() error { return e.err }

func fileErrorf(format string, args ...any) error { return fileError{fmt.Errorf(format, args...)} }

func (jt *jobType) check(ctx context.Context, db keylanepg.DB, st *statement, last bool) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sd, err := tx.Prepare(ctx, "", st.sql)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return fileError{fmt.Errorf("the server will not prepare it: %w", err)}
		}
		return err
	}
	if len(sd.ParamOIDs) != len(st.params) {
		return fileErrorf("the server counts %d parameters, the file %d", len(sd.ParamOIDs), len(st.params))
	}
	if jt.set && len(sd.ParamOIDs) > 0 {
		types, err := typesOf(ctx, tx, sd.ParamOIDs)
		if err != nil {
			return err
		}
		var errs []error
		for i, oid := range sd.ParamOIDs {
			if t := types[oid]; t.category != "A" {
				errs = append(errs, fileErrorf(":%s is %s: in a set type every parameter is an array, one element per job, in the jobs' order (write :%s::%s[] and unnest it)", st.params[i], t.name, st.params[i], t.name))
			}
		}
		if len(errs) > 0 {
			return fileError{errors.Join(errs...)}
		}
	}
	if !last || jt.result == resultNone {
		return nil
	}
	if len(sd.Fields) == 0 {
		return fileErrorf("it makes the job's result (%q) but returns no rows: return some (RETURNING, SELECT), or give \"result\": \"none\"", jt.result)
	}
	var names []string
	for _, fd := range sd.Fields {
		if slices.Contains(names, fd.Name) {
			return fileErrorf("column %q returned twice: a row is a JSON object, name each column once (AS)", fd.Name)
		}
		names = append(names, fd.Name)
	}
	if jt.set && !slices.Contains(names, "job_id") {
		return fileErrorf("a set type's result rows each name their job: return a column job_id (the :job.id element of its job); it returns %v", names)
	}
	return nil
}

type pgType struct{ name, category string }

// typesOf reads the names and categories ("A" for arrays) of types.
func typesOf(ctx context.Context, tx pgx.Tx, oids []uint32) (map[uint32]pgType, error) {
	rows, err := tx.Query(ctx, `SELECT oid::int8, format_type(oid, NULL), typcategory::text FROM pg_type WHERE oid = ANY($1::oid[])`, oids)
	if err != nil {
		return nil, err
	}
	m := map[uint32]pgType{}
	var (
		oid int64
		t   pgType
	)
	_, err = pgx.ForEachRow(rows, []any{&oid, &t.name, &t.category}, func() error {
		m[uint32(oid)] = t
		return nil
	})
	return m, err
}
