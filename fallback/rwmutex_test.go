package fallback_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

func TestRWReadersOverlap(t *testing.T) {
	l, _ := newLocker(t, nil)
	rw := l.RWMutex(uniqueKey(t))
	ctx := ctxT(t, 20*time.Second)
	const readers = 8
	var inside atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, readers)
	for range readers {
		wg.Go(func() {
			errc <- rw.RDo(ctx, func(ctx context.Context, _ uint64) error {
				inside.Add(1)
				// Hold until every reader is inside at once: only possible
				// if read locks overlap. A timeout is not this goroutine's
				// to report: the count checked below tells.
				_ = testwait.Poll(5*time.Second, func() error {
					if n := inside.Load(); n < readers {
						return fmt.Errorf("%d of %d readers inside", n, readers)
					}
					return nil
				})
				return nil
			})
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := inside.Load(); got != readers {
		t.Fatalf("%d readers inside together, want %d", got, readers)
	}
}

func TestRWWritersExclude(t *testing.T) {
	l, _ := newLocker(t, nil)
	rw := l.RWMutex(uniqueKey(t))
	ctx := ctxT(t, 30*time.Second)
	var readers, writers, maxReaders, violations atomic.Int64
	var lastFence atomic.Uint64
	var wg sync.WaitGroup
	errc := make(chan error, 256)
	section := func(write bool) func(context.Context, uint64) error {
		return func(ctx context.Context, fence uint64) error {
			if write {
				if writers.Add(1) != 1 || readers.Load() != 0 {
					violations.Add(1)
				}
				if prev := lastFence.Swap(fence); fence <= prev {
					violations.Add(1)
				}
				time.Sleep(time.Millisecond)
				writers.Add(-1)
				return nil
			}
			n := readers.Add(1)
			if writers.Load() != 0 {
				violations.Add(1)
			}
			for {
				m := maxReaders.Load()
				if n <= m || maxReaders.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			readers.Add(-1)
			return nil
		}
	}
	for i := range 12 {
		write := i%3 == 0
		wg.Go(func() {
			for range 8 {
				if write {
					errc <- rw.Do(ctx, section(true))
				} else {
					errc <- rw.RDo(ctx, section(false))
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d exclusion violations", v)
	}
	t.Logf("max concurrent readers: %d", maxReaders.Load())
}
