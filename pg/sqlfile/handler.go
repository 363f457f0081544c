package sqlfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
)

var _ keylanepg.SetHandler = (*File)(nil)

// Read queues the statements of jobs on b, in the jobs' order: a job of a
// plain type has its statements each run once for it; consecutive jobs
// of one set type have each of its statements run once for all of them,
// every parameter an array of their values. The Write it returns queues
// nothing (the statements ran with Read, their rows are read there) and
// makes each job's result of its last statement's rows.
//
// A job whose type the file does not name, whose payload is not a JSON
// object, lacks one of its type's fields or has one the type does not
// take, fails for good (keylane.Permanent): no retry changes its payload.
// So does a job whose statement the server refuses for its data (SQLSTATE
// class 22, a data exception: a value that does not parse as its
// parameter's type, out of range; class 23, an integrity constraint
// violated). Keylanepg's careful path then applies the transaction's
// jobs one at a time, so that the job fails alone. Any other error (a
// serialization failure, a lost connection) fails its job for a retry.
func (f *File) Read(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
	types := make([]*jobType, len(jobs))
	args := make([]map[string]*string, len(jobs))
	for i, job := range jobs {
		jt, ok := f.types[job.Type]
		if !ok {
			return nil, keylane.Permanent(fmt.Errorf("sqlfile: job %s: type %q is not in the SQL file (its types: %s)", job.ID, job.Type, strings.Join(f.Types(), ", ")))
		}
		a, err := jt.bind(job)
		if err != nil {
			return nil, keylane.Permanent(err)
		}
		types[i], args[i] = jt, a
	}
	rows := make([][]json.RawMessage, len(jobs)) // each job's rows of its last statement
	var errs []error                             // a row that could not be made JSON
	for i := 0; i < len(jobs); {
		jt := types[i]
		j := i + 1
		if jt.set {
			for j < len(jobs) && types[j] == jt {
				j++
			}
		}
		run := jobs[i:j]
		for s, st := range jt.stmts {
			collect := s == len(jt.stmts)-1 && jt.result != resultNone
			var q *pgx.QueuedQuery
			if jt.set {
				q = b.Queue(st.sql, setArgs(st, run, args[i:j])...)
			} else {
				q = b.Queue(st.sql, jobArgs(st, run[0], args[i])...)
			}
			q.Fn = readRows(run, rows[i:j], collect && jt.set, collect, &errs)
		}
		i = j
	}
	return func(*pgx.Batch) ([]keylanepg.SetResult, error) {
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		rs := make([]keylanepg.SetResult, len(jobs))
		for i, jt := range types {
			rs[i].Result, rs[i].Err = jt.makeResult(jobs[i], rows[i])
		}
		return rs, nil
	}, nil
}

// bind reads job's payload, a JSON object of the type's fields, into
// each field's value as text for the server to parse as its parameter's
// type (nil for null).
func (jt *jobType) bind(job keylane.Job) (map[string]*string, error) {
	vals := map[string]*string{paramJobID: &job.ID, paramJobKey: &job.Key}
	if len(jt.fields) == 0 && len(bytes.TrimSpace(job.Payload)) == 0 {
		return vals, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(job.Payload, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("sqlfile: job %s (type %q): its payload is not a JSON object of fields %v: %.60q", job.ID, jt.name, jt.fields, job.Payload)
	}
	var missing, unknown []string
	for _, fld := range jt.fields {
		raw, ok := obj[fld]
		if !ok {
			missing = append(missing, fld)
			continue
		}
		vals[fld] = text(raw)
	}
	for k := range obj {
		if _, ok := vals[k]; !ok || strings.HasPrefix(k, "job.") {
			unknown = append(unknown, k)
		}
	}
	switch {
	case len(missing) > 0:
		return nil, fmt.Errorf("sqlfile: job %s (type %q): its payload lacks field(s) %s (the type takes %v)", job.ID, jt.name, strings.Join(missing, ", "), jt.fields)
	case len(unknown) > 0:
		return nil, fmt.Errorf("sqlfile: job %s (type %q): its payload has field(s) %s, which the type does not take (it takes %v)", job.ID, jt.name, strings.Join(sortedUnique(unknown), ", "), jt.fields)
	}
	return vals, nil
}

// text is a JSON value as the text the server parses: a string's
// contents, a number's or a boolean's literal, an object's or an array's
// JSON (for a json or jsonb parameter); nil for null.
func text(raw json.RawMessage) *string {
	raw = bytes.TrimSpace(raw)
	var s string
	switch {
	case string(raw) == "null":
		return nil
	case len(raw) > 0 && raw[0] == '"':
		_ = json.Unmarshal(raw, &s) // valid: it was decoded as part of the object
	default:
		s = string(raw)
	}
	return &s
}

func jobArgs(st *statement, job keylane.Job, vals map[string]*string) []any {
	args := make([]any, len(st.params))
	for i, p := range st.params {
		if v := vals[p]; v != nil {
			args[i] = *v
		}
	}
	return args
}

// setArgs binds each parameter to an array of the jobs' values, in their
// order.
func setArgs(st *statement, jobs []keylane.Job, vals []map[string]*string) []any {
	args := make([]any, len(st.params))
	for i, p := range st.params {
		arr := make([]*string, len(jobs))
		for k := range jobs {
			arr[k] = vals[k][p]
		}
		args[i] = arr
	}
	return args
}

// readRows is a statement's pgx callback: it reads the rows, when
// collect, into the jobs' rows (each row to the job its job_id column
// names, when byJob; else all to the one job), and makes a failure that
// is the data's (classes 22 and 23) permanent.
func readRows(jobs []keylane.Job, rows [][]json.RawMessage, byJob, collect bool, errs *[]error) func(pgx.BatchResults) error {
	return func(br pgx.BatchResults) error {
		rs, err := br.Query()
		if err != nil {
			return classify(jobs, err)
		}
		defer rs.Close()
		at := map[string]int{}
		if byJob {
			for k, job := range jobs {
				at[job.ID] = k
			}
		}
		for collect && rs.Next() {
			vals, err := rs.Values()
			if err != nil {
				*errs = append(*errs, err)
				continue
			}
			obj, id, err := rowJSON(rs.FieldDescriptions(), vals, byJob)
			if err != nil {
				*errs = append(*errs, err)
				continue
			}
			k := 0
			if byJob {
				var ok bool
				if k, ok = at[id]; !ok {
					*errs = append(*errs, keylane.Permanent(fmt.Errorf("sqlfile: a set statement returned a row of job_id %q, not one of its jobs (from %s)", id, jobs[0].ID)))
					continue
				}
			}
			rows[k] = append(rows[k], obj)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return classify(jobs, err)
		}
		return nil
	}
}

// classify makes a statement's error permanent when it is the data's:
// SQLSTATE class 22 (data exception) or 23 (integrity constraint
// violation). The server gives the same answer on every try.
func classify(jobs []keylane.Job, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23")) {
		if len(jobs) == 1 {
			return keylane.Permanent(fmt.Errorf("sqlfile: job %s (type %q): %w", jobs[0].ID, jobs[0].Type, err))
		}
		return keylane.Permanent(fmt.Errorf("sqlfile: %d jobs of type %q from %s: %w", len(jobs), jobs[0].Type, jobs[0].ID, err))
	}
	return err
}

// makeResult makes job's result of its last statement's rows.
func (jt *jobType) makeResult(job keylane.Job, rows []json.RawMessage) ([]byte, error) {
	switch jt.result {
	case resultNone:
		return []byte("null"), nil
	case resultRow:
		switch len(rows) {
		case 0:
			return []byte("null"), nil
		case 1:
			return rows[0], nil
		}
		return nil, keylane.Permanent(fmt.Errorf("sqlfile: job %s (type %q): its statement returned %d rows, and its result is one (\"result\": \"row\")", job.ID, jt.name, len(rows)))
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, r := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(r)
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}

func sortedUnique(s []string) []string {
	m := map[string]bool{}
	for _, v := range s {
		m[v] = true
	}
	return sortedKeys(m)
}
