package keylanepg

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestOperatorsToFixClassifies: refusals no retry cures are permanent;
// 0A000 "cached plan must not change result type", which pgx cures on the
// next try by preparing the statement again, is not (it was: the whole
// class 0A counted as a feature the server lacks, and the worker held a
// group for an operator over a passing error).
func TestOperatorsToFixClassifies(t *testing.T) {
	for _, tc := range []struct {
		code, msg string
		want      bool
	}{
		{"42P01", `relation "keylane_fences" does not exist`, true},
		{"42501", "permission denied for table keylane_fences", true},
		{"3F000", `schema "x" does not exist`, true},
		{"28000", `role "app" is not permitted to log in`, true},
		{"0A000", "unsupported feature", true},
		{"0A000", "cached plan must not change result type", false},
		{"40001", "could not serialize access", false},
		{"57P01", "terminating connection due to administrator command", false},
	} {
		err := fmt.Errorf("apply: %w", &pgconn.PgError{Code: tc.code, Message: tc.msg})
		if got := operatorsToFix(err); got != tc.want {
			t.Errorf("%s %q: operatorsToFix %v, want %v", tc.code, tc.msg, got, tc.want)
		}
	}
}
