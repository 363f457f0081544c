package keylanepg_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: pools closed,
// servers stopped and waited for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
