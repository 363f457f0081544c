package keylanepg

import (
	"errors"
	"strings"
	"testing"

	"github.com/keylane/keylane"
)

// TestRefuseTxControl: statements that end or reshape the transaction
// are refused wherever they sit in the string (past comments, after
// another statement); the same words inside quotes, comments or longer
// identifiers are not.
func TestRefuseTxControl(t *testing.T) {
	refused := []string{
		"COMMIT", "commit;", "  Commit  ", "END", "end work", "ROLLBACK", "rollback to savepoint keylane_job",
		"ABORT", "BEGIN", "begin isolation level serializable", "START TRANSACTION", "SAVEPOINT s",
		"RELEASE SAVEPOINT keylane_job", "prepare transaction 'x'", "PREPARE\n  Transaction 'x'", "/* c */ commit", "-- c\ncommit",
		"select 1; commit", "update t set a = 'x;'; rollback", "select $$;$$; end", "select $t$ ' $t$;commit",
	}
	allowed := []string{
		"", ";", "SELECT 'commit'", "select 1 -- ; commit", "select 1 /* ; commit */", "update t set note = 'x; commit'",
		`select "end" from t`, "select endpoint from t", "UPDATE stock SET n = n - 1", "select $$;commit$$",
		"select $tag$ ; rollback $tag$", "prepare q as select 1", "begin_date", "select $my_tag$ ; commit $my_tag$", "insert into orders (committed) values (true)", "select 1; select 2",
		"WITH u AS (UPDATE stock SET n = n - 1 RETURNING n) SELECT n FROM u", "select 'it''s; commit'",
	}
	for _, sql := range refused {
		err := refuseTxControl("j", sql)
		if !errors.Is(err, ErrTxOwned) || !errors.Is(err, keylane.ErrPermanent) {
			t.Errorf("%q: %v, want a permanent ErrTxOwned", sql, err)
		}
	}
	for _, sql := range allowed {
		if err := refuseTxControl("j", sql); err != nil {
			t.Errorf("%q refused: %v", sql, err)
		}
	}
}

// FuzzStatements: statements never panics, and each statement it
// returns is a piece of the input starting at a non-blank byte.
func FuzzStatements(f *testing.F) {
	for _, s := range []string{"commit", "select 'a;b'; end", "$$", "$a$ x $a$", "/*", "--", `"`, "'", "select $1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		for _, st := range statements(sql) {
			if st == "" || !strings.Contains(sql, st) || strings.ContainsAny(st[:1], " \t\n\r\f;") {
				t.Fatalf("statement %q of %q", st, sql)
			}
		}
		_ = refuseTxControl("j", sql)
	})
}
