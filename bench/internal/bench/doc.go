// Package bench compares keylane with its peers in one process run: Redis
// locks (fallback.Do, redsync, redislock), PostgreSQL alone (a conditional
// UPDATE, a FOR UPDATE transaction) beside keylane in front of it
// (keylanepg), and the limits nothing built on
// them can pass (one atomic Lua script per purchase; a bare JetStream
// stream and consumer). Every contender sells the same flash sale, drawn
// from the same seeded generator, through the same buyer loop; runs are
// interleaved (run r of every workload and contender before run r+1, the
// order rotated each round) so drift of the machine hits all alike.
//
// Every run is bounded by a purchase count and by time, whichever comes
// first: buyers stop starting purchases at the deadline and the purchases
// in flight finish. Fire-and-forget modes stop submitting at the deadline
// and then wait until every job ran; that wait is part of the time.
//
// Every run checks the sale: no SKU sold more than its stock, and every
// SKU's final stock is its start minus the units sold (from the replies,
// or, without replies, from the demand). A contender that breaks it is
// marked and not ranked.
//
// Each run starts its servers afresh: a nats-server process (the separate
// placement; keylane's three workers and the raw consumer then run in a
// child process, a re-exec of this program) or a server embedded in this
// process; a redis-server process per run for the Redis contenders. CPU
// and peak RSS are read from /proc over the timed part of the run.
package bench
