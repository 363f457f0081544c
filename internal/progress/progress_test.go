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

// TestGrowingTotal: a bar whose total is found out as it goes does not
// complete when the count catches up with the total so far, only once
// the total is final.
func TestGrowingTotal(t *testing.T) {
	var buf bytes.Buffer
	d := New(&buf, true)
	b := d.Bar("bulk", 0)
	b.Grow(2)
	b.Add(2) // caught up, but more may come
	b.Grow(3)
	b.Add(3)
	b.SetTotal(5)
	grown := d.Bar("drain", 4)
	grown.Set(3)
	grown.SetTotal(6) // more than first counted
	grown.Set(6)
	d.Wait()
	final := buf.String()[strings.LastIndex(buf.String(), "\x1b[J")+1:]
	for _, want := range []string{"bulk", "5 / 5", "drain", "6 / 6"} {
		if !strings.Contains(final, want) {
			t.Errorf("final state lacks %q:\n%s", want, final)
		}
	}
	if strings.Contains(final, "stopped") {
		t.Errorf("a bar stopped:\n%s", final)
	}
}
