package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSaleCommand runs the README's first command, smaller, and checks it
// reports a clean verdict, and that its forced progress bar ends at the
// purchases' total.
func TestSaleCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"sale", "-purchases", "1500", "-buyers", "32", "--progress"}, &out, &errOut); err != nil {
		t.Fatalf("sale: %v\n%s", err, out.String())
	}
	if final := errOut.String()[strings.LastIndex(errOut.String(), "\x1b[J")+1:]; !strings.Contains(final, "purchases") || !strings.Contains(final, "1500 / 1500") || !strings.Contains(final, "done") {
		t.Errorf("the bar's final state: %q", final)
	}
	for _, want := range []string{"oversell 0", "stock mismatches 0", "max concurrent runs per key 1", "verdict: OK", "jobs/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUsageErrors(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{nil, {"nope"}, {"sale", "-skew", "0.5"}, {"call", "-key", "k"}} {
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
