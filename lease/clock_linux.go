//go:build linux

package lease

import (
	"math"
	"time"

	"golang.org/x/sys/unix"
)

// bootClock is the clock of the trust window. On Linux it reads
// CLOCK_BOOTTIME, which unlike CLOCK_MONOTONIC (and so unlike Go's
// monotonic clock) keeps counting while the system is suspended: a holder
// resumed after a suspend sees the time that passed and distrusts a lease
// that expired meanwhile. Kernels older than 2.6.39 have no CLOCK_BOOTTIME;
// there it falls back to monotonicClock.
var bootClock clock = pickBootClock()

func pickBootClock() clock {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return monotonicClock
	}
	return readBootTime
}

// readBootTime reads CLOCK_BOOTTIME. Once one read succeeded, a later one
// cannot fail (the clock exists and ts is valid); if it did, it reports the
// farthest future, so every trust window reads as closed rather than open.
func readBootTime() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return math.MaxInt64
	}
	return time.Duration(ts.Nano())
}
