package lease

import "time"

// clock reads the time as a duration since a fixed origin that differs
// from clock to clock. The trust window is kept on one: the send time of a
// write is a reading, and the deadline is a reading plus the window. Only
// readings of the same clock may be compared.
type clock func() time.Duration

// processStart is the origin of monotonicClock.
var processStart = time.Now()

// monotonicClock reads Go's monotonic clock. On Linux that is
// CLOCK_MONOTONIC, and on macOS mach_absolute_time: neither advances while
// the system is suspended, so it is only the fallback where bootClock has
// nothing better.
func monotonicClock() time.Duration { return time.Since(processStart) }
