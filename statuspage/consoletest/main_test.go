package consoletest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binsDir != "" {
		_ = os.RemoveAll(binsDir) // the binaries build built
	}
	os.Exit(code)
}
