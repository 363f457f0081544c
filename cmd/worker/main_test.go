package main

import (
	"context"
	"os"
	"testing"
)

// TestHelpExitsZero: -h prints the flags and is not a failure, so a
// script that asks for help does not see exit status 1.
func TestHelpExitsZero(t *testing.T) {
	stderr := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	os.Stderr = devnull
	defer func() { os.Stderr = stderr }()
	for _, arg := range []string{"-h", "--help"} {
		if err := run(context.Background(), []string{arg}); err != nil {
			t.Errorf("run(%q) = %v; want nil (exit 0)", arg, err)
		}
	}
}
