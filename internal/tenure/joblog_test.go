package tenure

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/keylane/keylane/internal/core"
)

// TestJobLogFreeAtInfo: with DEBUG off, the per-job events allocate
// nothing (and read no clock).
func TestJobLogFreeAtInfo(t *testing.T) {
	o := &Owner{log: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})).With("partition", 3, "fence", 9)}
	tk := &task{job: core.Job{ID: "j", Key: "sku:1", Seq: 42, Attempt: 1}}
	group := []core.Job{tk.job, tk.job}
	err := errors.New("x")
	if allocs := testing.AllocsPerRun(1000, func() {
		o.logReceived(tk, 1)
		start := o.jobClock()
		if !start.IsZero() {
			t.Fatal("read the clock at INFO")
		}
		o.logRan(&tk.job, start, err)
		o.logCommitted(group)
		o.logAcked(tk)
	}); allocs != 0 {
		t.Fatalf("%.1f allocations per job at INFO, want 0", allocs)
	}
}

// BenchmarkJobLog measures the per-job events at INFO (off) and DEBUG (to
// io.Discard).
func BenchmarkJobLog(b *testing.B) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		b.Run(level.String(), func(b *testing.B) {
			o := &Owner{log: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: level})).With("partition", 3, "fence", 9)}
			tk := &task{job: core.Job{ID: "j", Key: "sku:1", Seq: 42, Attempt: 1}}
			group := []core.Job{tk.job}
			b.ReportAllocs()
			for b.Loop() {
				o.logReceived(tk, 1)
				start := o.jobClock()
				o.logRan(&tk.job, start, nil)
				o.logCommitted(group)
				o.logAcked(tk)
			}
		})
	}
}
