package sqlfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// ErrInvalid is in every error that a file's content causes, at Parse or
// at Check: the file is to fix, and nothing should run with it. An error
// of Check without it (the database unreachable) is not the file's.
var ErrInvalid = errors.New("sqlfile: invalid SQL file")

// File is a parsed SQL file: its job types, each with its statements. A
// File is a keylanepg.SetHandler (Read), for a keylanepg.Applier's Set.
// It is not changed after Parse and is safe for concurrent use.
type File struct {
	types map[string]*jobType
}

// resultKind is how a job's result is made of its last statement's rows.
type resultKind string

const (
	resultRows resultKind = "rows" // a JSON array of row objects
	resultRow  resultKind = "row"  // the one row's object, or null for none
	resultNone resultKind = "none" // null
)

type jobType struct {
	name   string
	fields []string
	set    bool
	result resultKind
	stmts  []*statement
}

// statement is one statement of a job type, its named parameters
// rewritten to positional ones.
type statement struct {
	n      int      // 1-based, for errors
	sql    string   // as sent: $1, $2, ...
	params []string // the name of $1, $2, ...
}

// rawFile is the file's JSON.
type rawFile struct {
	Jobs map[string]*rawType `json:"jobs"`
}

type rawType struct {
	Fields     []string    `json:"fields"`
	Set        bool        `json:"set"`
	Statements []sqlSource `json:"statements"`
	Result     string      `json:"result"`
}

// sqlSource is a statement as the file gives it: a string, or an array of
// strings, its lines (joined with newlines), for a long statement.
type sqlSource string

func (s *sqlSource) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = sqlSource(one)
		return nil
	}
	var lines []string
	if err := json.Unmarshal(b, &lines); err != nil {
		return errors.New("a statement is a string, or an array of strings (its lines)")
	}
	*s = sqlSource(strings.Join(lines, "\n"))
	return nil
}

var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Load reads and parses the file at path (see Parse).
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse parses a SQL file and checks what can be checked without a
// database: the JSON (no unknown key), each job type's fields (names,
// none twice), statements (at least one; named parameters only, each a
// field of the type or a builtin, every field bound by some statement;
// none that ends or reshapes the transaction) and result. Every fault
// found is reported, each naming its job type and statement, joined in
// one error with ErrInvalid. Check then prepares the statements against
// the database.
func Parse(data []byte) (*File, error) {
	var raw rawFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: more than one JSON value", ErrInvalid)
	}
	if len(raw.Jobs) == 0 {
		return nil, fmt.Errorf(`%w: no job types: the file is {"jobs": {"<type>": {"fields": [...], "statements": [...]}}}`, ErrInvalid)
	}
	f := &File{types: map[string]*jobType{}}
	var errs []error
	for _, name := range sortedKeys(raw.Jobs) {
		jt, err := parseType(name, raw.Jobs[name])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.types[name] = jt
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w:\n%w", ErrInvalid, errors.Join(errs...))
	}
	return f, nil
}

func parseType(name string, raw *rawType) (*jobType, error) {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("job type %q: "+format, append([]any{name}, args...)...))
	}
	if raw == nil {
		fail("null; give its fields and statements")
		return nil, errors.Join(errs...)
	}
	if name == "" {
		fail("a job type needs a name (a job without one matches none)")
	}
	jt := &jobType{name: name, fields: raw.Fields, set: raw.Set, result: resultKind(raw.Result)}
	if jt.result == "" {
		jt.result = resultRows
	}
	if !slices.Contains([]resultKind{resultRows, resultRow, resultNone}, jt.result) {
		fail(`result %q: want "rows" (the default), "row" or "none"`, raw.Result)
	}
	seen := map[string]bool{}
	for _, fld := range raw.Fields {
		switch {
		case !fieldName.MatchString(fld):
			fail("field %q: a field's name is letters, digits and _, not starting with a digit", fld)
		case seen[fld]:
			fail("field %q given twice", fld)
		}
		seen[fld] = true
	}
	if len(raw.Statements) == 0 {
		fail("no statements")
	}
	used := map[string]bool{}
	for i, s := range raw.Statements {
		n, src := i+1, string(s)
		if strings.TrimSpace(src) == "" {
			fail("statement %d is empty", n)
			continue
		}
		if w := firstWord(src); slices.Contains(txWords, w) {
			fail("statement %d is %s: the group's transaction is keylanepg's to begin, commit or roll back (see package keylanepg)", n, strings.ToUpper(w))
			continue
		}
		sql, params, err := bindNames(src)
		if err != nil {
			fail("statement %d: %v", n, err)
			continue
		}
		for _, p := range params {
			switch {
			case strings.HasPrefix(p, "job.") && !slices.Contains(builtins, p):
				fail("statement %d: unknown parameter :%s (the job's own are :job.id and :job.key)", n, p)
			case !strings.HasPrefix(p, "job.") && !seen[p]:
				fail("statement %d: unknown parameter :%s: not one of the type's fields %v (add it to \"fields\", or fix the name)", n, p, raw.Fields)
			}
			used[p] = true
		}
		jt.stmts = append(jt.stmts, &statement{n: n, sql: sql, params: params})
	}
	for _, fld := range raw.Fields {
		if seen[fld] && !used[fld] && fieldName.MatchString(fld) {
			fail("field %q is bound by no statement (a payload's field that nothing reads would be dropped without a word)", fld)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return jt, nil
}

// Types returns the file's job types, sorted.
func (f *File) Types() []string { return sortedKeys(f.types) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
