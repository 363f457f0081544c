// Package progress draws the commands' progress bars (redrive --all,
// repartition, a sale, a bulk submit) with github.com/vbauerster/mpb.
//
// Bars go to the writer given, which the commands make stderr, and only
// when it is a terminal or the command's --progress flag forces them: a
// script that captures the output sees no bar. A Display that draws
// nothing costs nothing, and every method is safe on it, so a command
// calls the same code either way.
package progress

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/cwriter"
	"github.com/vbauerster/mpb/v8/decor"
)

// Display is one command's set of bars. Its zero value draws nothing. It
// is safe for concurrent use.
type Display struct {
	p    *mpb.Progress
	mu   sync.Mutex
	bars []*mpb.Bar
	term bool
}

// New returns a Display that draws on w when w is a terminal, or when
// force is set (w then gets the bars' text, redrawn as it changes, and
// their final state); otherwise one that draws nothing.
func New(w io.Writer, force bool) *Display {
	term := terminal(w)
	if !term && !force {
		return &Display{}
	}
	return &Display{
		p:    mpb.New(mpb.WithOutput(w), mpb.WithWidth(72), mpb.WithAutoRefresh(), mpb.WithRefreshRate(150*time.Millisecond)),
		term: term,
	}
}

// terminal reports whether w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && cwriter.IsTerminal(int(f.Fd()))
}

// Active reports whether d draws.
func (d *Display) Active() bool { return d.p != nil }

// Bar adds a bar named name that counts to total.
func (d *Display) Bar(name string, total int64) *Bar {
	if d.p == nil {
		return &Bar{}
	}
	b := d.p.AddBar(total,
		mpb.PrependDecorators(
			decor.Name(name, decor.WCSyncSpaceR),
			decor.CountersNoUnit("%d / %d", decor.WCSyncWidth),
		),
		mpb.AppendDecorators(
			decor.OnAbort(decor.OnComplete(decor.AverageETA(decor.ET_STYLE_GO), "done"), "stopped"),
		),
	)
	d.mu.Lock()
	d.bars = append(d.bars, b)
	d.mu.Unlock()
	return &Bar{b: b}
}

// Lines returns where the command should write its own lines while the
// bars draw: when out is a terminal and so is the bars' writer, above the
// bars (they share the screen); otherwise out itself.
func (d *Display) Lines(out io.Writer) io.Writer {
	if d.p == nil || !d.term || !terminal(out) {
		return out
	}
	return &above{p: d.p, out: out}
}

type above struct {
	p   *mpb.Progress
	out io.Writer
}

func (a *above) Write(b []byte) (int, error) {
	n, err := a.p.Write(b)
	if errors.Is(err, mpb.ErrDone) {
		return a.out.Write(b)
	}
	return n, err
}

// Wait stops every bar that did not reach its total where it is (shown as
// "stopped"), draws the final state and returns once drawing has ended.
// Call it once, after the work, on every path.
func (d *Display) Wait() {
	if d.p == nil {
		return
	}
	d.mu.Lock()
	for _, b := range d.bars {
		b.Abort(false) // a no-op on a completed bar; Completed() races in mpb v8.9.3
	}
	d.mu.Unlock()
	d.p.Wait()
}

// Bar is one bar of a Display. Its zero value, and a Bar of a Display that
// draws nothing, ignore every call, as does a nil *Bar. It is safe for
// concurrent use.
type Bar struct {
	b *mpb.Bar
}

// Add counts n more done.
func (b *Bar) Add(n int) {
	if b != nil && b.b != nil {
		b.b.IncrBy(n)
	}
}

// Set sets how many are done.
func (b *Bar) Set(done int64) {
	if b != nil && b.b != nil {
		b.b.SetCurrent(done)
	}
}

// SetTotal changes the bar's total, as when the work turns out larger.
func (b *Bar) SetTotal(total int64) {
	if b != nil && b.b != nil {
		b.b.SetTotal(total, false)
	}
}
