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
	p     *mpb.Progress
	mu    sync.Mutex
	bars  []*mpb.Bar
	w     io.Writer // where the bars go
	term  bool
	delay *time.Timer // NewAfter's, until the bars show
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
		w:    w,
		term: term,
	}
}

// NewAfter is New for work that may be short: unless forced, the bars
// appear only once it has run for after (a sale of a few seconds shows
// none). Wait before then and nothing was drawn.
func NewAfter(w io.Writer, force bool, after time.Duration) *Display {
	term := terminal(w)
	if force || !term {
		return New(w, force)
	}
	shown := make(chan struct{})
	d := &Display{
		p:    mpb.New(mpb.WithOutput(w), mpb.WithWidth(72), mpb.WithAutoRefresh(), mpb.WithRefreshRate(150*time.Millisecond), mpb.WithRenderDelay(shown)),
		w:    w,
		term: term,
	}
	d.delay = time.AfterFunc(after, func() { close(shown) })
	return d
}

// terminal reports whether w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && cwriter.IsTerminal(int(f.Fd()))
}

// Active reports whether d draws.
func (d *Display) Active() bool { return d.p != nil }

// Bar adds a bar named name that counts to total; a total of 0 is not
// known yet (Grow it, then SetTotal).
func (d *Display) Bar(name string, total int64) *Bar {
	if d.p == nil {
		return &Bar{}
	}
	// The mpb bar is made open-ended (total 0) so that its total can
	// change; Bar completes it when the count reaches a final total.
	b := d.p.AddBar(0,
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
	bar := &Bar{b: b}
	if total > 0 {
		bar.SetTotal(total)
	}
	return bar
}

// Lines returns where the command should write its own lines while the
// bars draw: when out is a terminal and so is the bars' writer, above the
// bars (they share the screen), and so when out is the bars' own writer
// (the lines and the bars come in turn); otherwise out itself.
func (d *Display) Lines(out io.Writer) io.Writer {
	if d.p == nil || d.delay != nil || !(out == d.w || d.term && terminal(out)) {
		return out // a delayed Display may never show: its lines would vanish
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
	if d.delay != nil {
		d.delay.Stop() // not shown yet: stays so
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
	b     *mpb.Bar
	mu    sync.Mutex
	done  int64
	total int64
	final bool
}

// Add counts n more done.
func (b *Bar) Add(n int) {
	b.update(func() { b.done += int64(n) })
}

// Set sets how many are done.
func (b *Bar) Set(done int64) {
	b.update(func() { b.done = done })
}

// Grow adds n to a total that is still being found out (lines read from
// a stream); the bar does not complete until SetTotal says the total.
func (b *Bar) Grow(n int) {
	b.update(func() { b.total += int64(n) })
}

// SetTotal sets the total, final: the bar completes when the count
// reaches it. It may be set again (the work turned out larger) until then.
func (b *Bar) SetTotal(total int64) {
	b.update(func() { b.total, b.final = total, true })
}

func (b *Bar) update(change func()) {
	if b == nil || b.b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	change()
	complete := b.final && b.done >= b.total
	b.b.SetTotal(b.total, complete)
	if !complete {
		b.b.SetCurrent(b.done)
	}
}
