// Package sale runs flash sales against keylane's inventory handler and
// checks them. It is the sale driver of `submit sale` and the e2e tests.
// The bench (bench/) runs keylane through StartLocal and draws its
// purchases with Picks, but drives every contender, keylane and its peers,
// through its own timed harness:
//
//   - sale.go: Run, the driver, which stocks the SKUs, buys with many
//     buyers and returns a Verdict on the invariants (no oversell, final
//     stock = start − sold, one run per key at a time, runs in order).
//   - handler.go: Handler, the inventory handler with the knobs of tests
//     and demos (a hold inside the critical section, a Tracker), so that
//     package inventory carries none.
//   - tracker.go: Tracker, which watches handler runs in a process and can
//     log each one as a JSON Span for checks across processes.
//   - local.go: StartLocal, a whole deployment in one process: an embedded
//     NATS server and several workers running Handler.
package sale
