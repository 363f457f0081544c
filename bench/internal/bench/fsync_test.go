package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// BenchmarkFsync is what the disk under the bench's temporary
// directory can sync: writers that each append 4 KiB and fsync their
// own file, in a loop, reporting syncs a second across them. A syncing
// NATS stream is one writer (its writes sync one after another);
// PostgreSQL's WAL another.
//
//	cd bench && go test -run '^$' -bench Fsync -benchtime 2s ./internal/bench/
func BenchmarkFsync(b *testing.B) {
	for _, writers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			dir := b.TempDir()
			files := make([]*os.File, writers)
			for i := range files {
				f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				files[i] = f
			}
			buf := make([]byte, 4096)
			b.ResetTimer()
			var wg sync.WaitGroup
			for _, f := range files {
				wg.Go(func() {
					for range b.N {
						if _, err := f.Write(buf); err != nil {
							b.Error(err)
							return
						}
						if err := f.Sync(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N*writers)/b.Elapsed().Seconds(), "fsyncs/s")
		})
	}
}
