//go:build !linux

package lease

// bootClock is the clock of the trust window. Outside Linux it is Go's
// monotonic clock, which on some systems (macOS among them) stops while the
// system is suspended: there a holder resumed after a suspend may trust a
// lease that expired, until its next renew fails. Fencing still refuses its
// writes.
var bootClock clock = monotonicClock
