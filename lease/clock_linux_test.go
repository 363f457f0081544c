package lease

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func readClock(t testing.TB, id int32) time.Duration {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		t.Fatalf("clock_gettime(%d): %v", id, err)
	}
	return time.Duration(ts.Nano())
}

// On Linux the trust window's clock is CLOCK_BOOTTIME, not the monotonic
// fallback: a reading of it lies between two direct reads of
// CLOCK_BOOTTIME.
func TestBootClockReadsCLOCK_BOOTTIME(t *testing.T) {
	before := readClock(t, unix.CLOCK_BOOTTIME)
	got := bootClock()
	after := readClock(t, unix.CLOCK_BOOTTIME)
	if got < before || got > after {
		t.Fatalf("bootClock() = %d, not within CLOCK_BOOTTIME reads %d..%d", got, before, after)
	}
	// BOOTTIME - MONOTONIC is the time this host spent suspended since
	// boot (shifted by a time namespace's offsets, if any): logged, not
	// checked.
	t.Logf("CLOCK_BOOTTIME - CLOCK_MONOTONIC = %s", got-readClock(t, unix.CLOCK_MONOTONIC))
}

// Without a suspend the boot clock never goes back and advances at the
// rate of CLOCK_MONOTONIC (Go's monotonic clock).
func TestBootClockMatchesMonotonicWithoutSuspend(t *testing.T) {
	const span = 50 * time.Millisecond
	boot0 := bootClock()
	mono0 := readClock(t, unix.CLOCK_MONOTONIC)
	start := time.Now()
	prev, reads := boot0, 0
	for time.Since(start) < span {
		now := bootClock()
		if now < prev {
			t.Fatalf("boot clock went back from %d to %d after %d reads", prev, now, reads)
		}
		prev = now
		reads++
	}
	mono1 := readClock(t, unix.CLOCK_MONOTONIC)
	boot1 := bootClock()
	// The boot clock was read first and last, so without a suspend its
	// span covers the monotonic one, plus scheduling noise between reads.
	dBoot, dMono := boot1-boot0, mono1-mono0
	if dBoot < dMono || dBoot-dMono > 20*time.Millisecond {
		t.Fatalf("boot clock advanced %s while CLOCK_MONOTONIC advanced %s", dBoot, dMono)
	}
	t.Logf("%d reads over %s; boot clock %s, monotonic %s", reads, dMono, dBoot, dMono)
}

func BenchmarkBootClock(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = bootClock()
	}
}

func BenchmarkMonotonicClock(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = monotonicClock()
	}
}
