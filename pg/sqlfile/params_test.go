package sqlfile

import (
	"slices"
	"strings"
	"testing"
)

// TestBindNames: named parameters become positional ones, one number a
// name; quotes, dollar quotes, comments and casts are left alone.
func TestBindNames(t *testing.T) {
	for _, tc := range []struct {
		src, sql string
		names    []string
	}{
		{"SELECT :a, :b, :a", "SELECT $1, $2, $1", []string{"a", "b"}},
		{"SELECT :job.id, :job.key::text", "SELECT $1, $2::text", []string{"job.id", "job.key"}},
		{"SELECT n::bigint FROM t WHERE x = :x", "SELECT n::bigint FROM t WHERE x = $1", []string{"x"}},
		{"SELECT ':no', \"col:no\", E'\\':no' FROM t WHERE y = :y", "SELECT ':no', \"col:no\", E'\\':no' FROM t WHERE y = $1", []string{"y"}},
		{"SELECT 'it''s :no', :z", "SELECT 'it''s :no', $1", []string{"z"}},
		{"SELECT $$ :no $$, $tag$ :no $x$ $tag$, :w", "SELECT $$ :no $$, $tag$ :no $x$ $tag$, $1", []string{"w"}},
		{"SELECT 1 -- :no\n, :v /* :no /* :no */ :no */", "SELECT 1 -- :no\n, $1 /* :no /* :no */ :no */", []string{"v"}},
		{"SELECT arr[1:2] FROM t", "SELECT arr[1:2] FROM t", nil},
		{"SELECT :job.fence", "SELECT $1", []string{"job.fence"}}, // refused by Parse as unknown
	} {
		sql, names, err := bindNames(tc.src)
		if err != nil || sql != tc.sql || !slices.Equal(names, tc.names) {
			t.Errorf("bindNames(%q) = %q, %q, %v; want %q, %q", tc.src, sql, names, err, tc.sql, tc.names)
		}
	}
	for _, src := range []string{"SELECT $1", "SELECT 'open", "SELECT \"open", "SELECT /* open"} {
		if _, _, err := bindNames(src); err == nil {
			t.Errorf("bindNames(%q): no error", src)
		}
	}
	if _, _, err := bindNames("SELECT $1"); !strings.Contains(err.Error(), "name it instead") {
		t.Errorf("a positional parameter: %v", err)
	}
}
