package sqlfile_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keylane/keylane/pg/sqlfile"
)

// TestParseRefuses: a file with a fault is refused with ErrInvalid and an
// error that names the type, the statement and what is wrong; every
// fault of the file is named at once.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		says       []string
	}{
		{"not JSON", `{"jobs":`, []string{"unexpected EOF"}},
		{"unknown key", `{"jobs":{"a":{"statements":["SELECT 1"],"retries":3}}}`, []string{`unknown field "retries"`}},
		{"no types", `{"jobs":{}}`, []string{"no job types"}},
		{"two values", `{"jobs":{"a":{"statements":["SELECT 1"]}}} {}`, []string{"more than one JSON value"}},
		{"no statements", `{"jobs":{"a":{}}}`, []string{`job type "a": no statements`}},
		{"empty statement", `{"jobs":{"a":{"statements":[" "]}}}`, []string{`job type "a": statement 1 is empty`}},
		{"unknown parameter", `{"jobs":{"buy":{"fields":["qty"],"statements":["SELECT :qty","SELECT :qtty"]}}}`, []string{`job type "buy": statement 2: unknown parameter :qtty`}},
		{"unknown builtin", `{"jobs":{"a":{"statements":["SELECT :job.fence"]}}}`, []string{"unknown parameter :job.fence"}},
		{"unbound field", `{"jobs":{"a":{"fields":["qty","note"],"statements":["SELECT :qty"]}}}`, []string{`field "note" is bound by no statement`}},
		{"bad field name", `{"jobs":{"a":{"fields":["q-ty"],"statements":["SELECT 1"]}}}`, []string{`field "q-ty"`}},
		{"field twice", `{"jobs":{"a":{"fields":["q","q"],"statements":["SELECT :q"]}}}`, []string{`field "q" given twice`}},
		{"positional", `{"jobs":{"a":{"statements":["SELECT $1"]}}}`, []string{"positional parameter $1"}},
		{"commit", `{"jobs":{"a":{"statements":["SELECT 1", " /* x */ COMMIT"]}}}`, []string{"statement 2 is COMMIT"}},
		{"bad result", `{"jobs":{"a":{"statements":["SELECT 1"],"result":"all"}}}`, []string{`result "all"`}},
		{"bad statement form", `{"jobs":{"a":{"statements":[1]}}}`, []string{"a statement is a string, or an array of strings"}},
		{"every fault", `{"jobs":{"a":{"statements":[]},"b":{"statements":["SELECT :x"]}}}`, []string{`job type "a": no statements`, `job type "b": statement 1: unknown parameter :x`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := sqlfile.Parse([]byte(tc.file))
			if f != nil || !errors.Is(err, sqlfile.ErrInvalid) {
				t.Fatalf("Parse = %v, %v; want ErrInvalid", f, err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestParseExample: the example file parses, its types sorted.
func TestParseExample(t *testing.T) {
	f, err := sqlfile.Load("../cmd/keylane-pg/example/shop.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.Types(), " "); got != "buy buy-one orders restock stock" {
		t.Errorf("types %q", got)
	}
}
