package progress

import (
	"bytes"
	"strings"
	"testing"
)

// TestForcedBarShowsItsTotal: forced into a buffer, a bar's final state
// counts to its total and says done; one stopped short says so.
func TestForcedBarShowsItsTotal(t *testing.T) {
	var buf bytes.Buffer
	d := New(&buf, true)
	done := d.Bar("redrive", 3)
	short := d.Bar("drain", 10)
	for range 3 {
		done.Add(1)
	}
	short.Set(4)
	d.Wait()
	out := buf.String()
	for _, want := range []string{"redrive", "3 / 3", "done", "drain", "4 / 10", "stopped"} {
		if !strings.Contains(out, want) {
			t.Errorf("bars lack %q:\n%s", want, out)
		}
	}
}

// TestNoTerminalNoBars: a writer that is not a terminal gets nothing
// unless forced, and the calls are harmless.
func TestNoTerminalNoBars(t *testing.T) {
	var buf bytes.Buffer
	d := New(&buf, false)
	if d.Active() {
		t.Fatal("a buffer counts as a terminal")
	}
	b := d.Bar("x", 2)
	b.Add(1)
	b.SetTotal(5)
	b.Set(5)
	if d.Lines(&buf) != &buf {
		t.Error("Lines changed the writer with no bars drawn")
	}
	d.Wait()
	if buf.Len() != 0 {
		t.Fatalf("wrote %q", buf.String())
	}
}
