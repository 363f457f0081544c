// Package keylanepg applies keylane jobs to a PostgreSQL database (pgx v5):
// a partition's ready jobs, of one key or several, in one transaction that
// keylanepg opens and commits, each job exactly once across crashes and
// redeliveries, and refused at the database when a newer owner of the
// partition has committed. It is its own module, so keylane's go.mod has
// no pgx.
//
// keylane already serializes a key's jobs, so the database need not: a hot
// key's queued jobs, and the ready jobs of the partition's other keys, go
// in one transaction with one commit (one WAL flush) instead of one
// transaction each, every one waiting on the hot row's lock.
//
// # With a keylane worker
//
// Applier is keylane's GroupApplier (WorkerConfig.Applier): the worker
// groups a key's queued jobs, as it does for a Reducer, and hands each
// group to Apply under its partition's fence:
//
//	pool, _ := pgxpool.New(ctx, url)
//	_ = keylanepg.Ensure(ctx, pool)
//	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{
//		Applier: &keylanepg.Applier{DB: pool, Handler: shop.Sell, IdleTimeout: keylane.DefaultLeaseTTL / 2},
//	})
//
// A Handler runs each statement as a round trip of its own. A
// PipelineHandler (Applier.Pipeline, ApplyPipeline) queues a job's
// statements on a pgx.Batch instead, and the whole group's go in one
// round trip: a transaction costs two round trips on a *pgxpool.Pool
// (three on another DB) whatever its number of jobs (see "Pipelined
// handlers"). shop.SellPipeline is the shop's sale
// that way, one statement a purchase:
//
//	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{
//		Applier: &keylanepg.Applier{DB: pool, Pipeline: shop.SellPipeline, IdleTimeout: keylane.DefaultLeaseTTL / 2},
//	})
//
// A SetHandler (Applier.Set, ApplySet) reads and writes a transaction's
// jobs together: its reads in the first round trip, its writes — a few
// statements for all the jobs, whatever their number — with the record
// and COMMIT in the second (see "Set handlers"). shop.SellSet sells that
// way, and is the fastest of the shop's three:
//
//	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{
//		Applier: &keylanepg.Applier{DB: pool, Set: shop.SellSet, IdleTimeout: keylane.DefaultLeaseTTL / 2},
//	})
//
// Applied and Recorded jobs are Done: the worker replies with their
// result and acks them. A Failed job is retried alone by the worker, or
// dead-lettered when its Err is permanent; a Held one runs after it. A
// StaleFenceError steps the owner down; any other error of Apply leaves
// the group unreplied and unacked, and the worker applies it again with
// backoff, its first job alone: the record answers what did commit. So
// exactly once across a worker's crash rests on keylane_outcomes: a
// redelivered job is answered from there, never applied again.
//
// The worker reads that record before it dead-letters any job
// (Applier.ReadRecord, keylane.RecordReader): a job that committed, whose
// owners all died before the ack until its restart counter passed
// MaxDeliver, is answered from the record, not told "dead-lettered"
// (TestCommittedJobIsNotDeadLettered). And it counts the calls that fail
// whole with the job alone: past MaxDeliver of them, the record read
// (the database is up) and the job not in it, the job is dead-lettered
// for good instead of blocking its key for ever
// (TestWholeGroupFailureEnds: a Handler that swallows a database error).
// A failure for want of the database (no answer from the server, or its
// SQLSTATE class 08, 57, 53, 58 or 40) is marked keylane.ErrUnavailable
// and never counted, nor is one while the record cannot be read: the job
// waits for the database. cmd/sale runs submit sale's flash sale
// this way (shop.SellSet; --handler pipeline or handler for
// shop.SellPipeline or shop.Sell) and checks
// the verdict against the rows:
//
//	go run -C pg ./cmd/sale --postgres local
//
// The worker joins the groups of a partition's keys that are ready while
// a transaction is in flight into its next Apply, as many keys as
// WorkerConfig.Concurrency lets run at once (64 by default with an
// Applier): one transaction, one commit, for several keys (their transactions would wait on the fence
// row's lock one after another anyway). Applier caps a transaction at
// MaxJobs jobs (DefaultMaxJobs, 64: the subtransactions below): a larger
// call (a hot key's queue, the groups of up to the worker's Concurrency
// keys of 256 jobs each) is applied in several transactions, one after
// another in its order, each fenced and recorded as above. A key whose
// job failed retriably in one holds its later jobs in the next ones too.
// If one of them fails, the call fails, whatever those before it
// committed: the worker applies the group again and the record answers
// those.
//
// # Tables
//
// keylanepg keeps two tables of its own beside the user's (Schema; Ensure
// creates them or checks them, and their rights, at start):
//
//	keylane_fences(namespace, partition, fence)   the newest fence committed per partition
//	keylane_outcomes(namespace, job_id, key, fence, result, at)
//	                                              each applied job's result,
//	                                              indexed by (namespace, at) for Prune
//
// # The transaction
//
// Apply runs, on one connection, in this order:
//
//  1. In one round trip: BEGIN ISOLATION LEVEL READ COMMITTED; the
//     fence — an INSERT … ON CONFLICT DO UPDATE
//     SET fence = $fence WHERE fence <= $fence on the partition's row,
//     which takes the row's lock and keeps it to the end; the recorded
//     outcomes of the group's job IDs, read after the lock; the first
//     job's SAVEPOINT. No row back from the fence statement means a newer
//     fence has committed: Apply reads it, rolls back and returns a
//     *StaleFenceError (errors.Is keylane.ErrStaleFence). Nothing ran.
//  2. For each job, in order: a job with a recorded outcome is answered
//     from it and not run (Recorded). A job whose key had a retriable
//     failure earlier in the group is not run (Held: running it would
//     reorder the key). Any other job runs the Handler inside the open
//     savepoint. Success: the savepoint is released and a new one opened,
//     sent with the next job's first statement (no round trip of its own).
//     Failure (an error, a failed statement, a panic): ROLLBACK TO
//     SAVEPOINT undoes that job's writes alone, and the job is reported
//     Failed, not recorded; for good (keylane.ErrPermanent) when pgx
//     cannot encode its arguments (a uint64 above the largest bigint),
//     which no retry cures. Two failures of one job cost the transaction, not just the job's
//     savepoint, and are settled in a new one, the rest of the group
//     applied again without the job (at most once per job): a statement
//     pgx could not send with others of its batch (an argument it cannot
//     encode, which makes pgx close the connection; a statement the
//     server will not prepare, 42703, which aborts the transaction before
//     the job's savepoint was taken, when it rode with it), and a COMMIT
//     the server refused (a DEFERRABLE INITIALLY DEFERRED constraint
//     broken, 23503): a known rollback, not an unknown fate. The group
//     is then applied again with each job's deferred constraints checked
//     at its end (SAVEPOINT; SET CONSTRAINTS ALL IMMEDIATE; ROLLBACK TO
//     it: the check's verdict, not its mode, stays), so the job that
//     broke one fails alone and the others commit. A pgx option of a
//     call (pgx.QueryResultFormats, a query mode) never rides with the
//     savepoint: a batch would take it for an argument.
//     TestPoisonJobFailsAlone holds every kind to this for each fault.
//  3. One INSERT records every applied job's outcome (job ID → result,
//     key, fence, transaction time).
//  4. COMMIT.
//
// Then, outside this package (Applier and keylane's worker), the worker replies to each Applied or
// Recorded job and acks it; a Failed job is retried (its key's later jobs
// with it, as Held ones) or, when errors.Is(err, keylane.ErrPermanent),
// dead-lettered, and the key's later jobs go on.
//
// # Pipelined handlers
//
// ApplyPipeline (and Applier with Pipeline set) applies a group through a
// PipelineHandler in the same transaction, with the same tables, fence,
// outcomes and statuses as Apply, in two ways:
//
// The fast path, tried first, with no savepoint:
//
//  1. One round trip: BEGIN; the fence; the outcomes look-up; then every
//     job's queued statements, in the group's order (a job whose Queue
//     refused sends nothing and is Failed at once, and a retriable refusal
//     holds its key's later jobs, as in Apply).
//  2. The fence refused: roll back, *StaleFenceError; the statements that
//     rode with it are undone with the transaction. A job of the group
//     already recorded (a redelivery), one ID twice in the group, or a job
//     that failed after sending (a failed statement, which aborts the
//     transaction; a callback's error; its Result's error or panic): roll
//     back, nothing of the group written, and take the careful path.
//  3. Otherwise one INSERT records every applied job's outcome, and
//     COMMIT. On a DB that lends connections (a *pgxpool.Pool: the fast
//     path runs its transaction on a connection it acquires) the INSERT
//     and COMMIT go in one message: two round trips in all. A failed
//     INSERT makes the server skip the COMMIT, and the transaction is
//     rolled back whole, the error the record's
//     (TestPipelineFailedRecordCommitsNothing); a cut connection after
//     the message leaves the commit's fate unknown, as a cut COMMIT does
//     (TestConnectionCutMidGroup, TestPipelineConnectionCut). On another
//     DB (a *pgx.Conn, a pgx.Tx) the transaction is a pgx.Tx, whose
//     Commit is a round trip of its own: three round trips
//     (TestPipelineSendsTheGroupInTwoRoundTrips counts both).
//
// The careful path is Apply's transaction, above, with each job's queued
// statements sent as one batch in its own savepoint: a recorded job is
// answered from the record, a failing job is rolled back alone and the
// rest of the group commits. It costs a round trip or two per job, and
// runs only for a group in which something failed or came back; the next
// group tries the fast path again. So a job's statements may run twice
// (rolled back the first time) before they commit once: Queue must build
// them from the job alone, without side effects, as a Handler must.
//
// What may go in a PipelineHandler: any statements, each with its pgx
// callback (QueryRow, Query, Exec) to read its results into the job's
// Result; what one statement cannot know from another's result in Go it
// can in SQL (a data-modifying WITH; shop's buySQL sells, inserts the
// order and returns the stock left in one statement). Not: statements
// that end or reshape the transaction (BEGIN, START, COMMIT, END,
// ROLLBACK, ABORT, SAVEPOINT, RELEASE, PREPARE TRANSACTION): Queue's job
// is refused with them, before anything is sent, failing for good with
// ErrTxOwned (TestTransactionControlIsRefused); nor several statements in
// one string (a batch sends each as a prepared statement). A failed statement aborts
// the transaction: in the fast path that is expected (the careful path
// follows), so a statement that is expected to fail (an INSERT that may
// hit a unique key) costs a careful path every time; write it to succeed
// (ON CONFLICT DO NOTHING, and read the outcome from its result).
//
// The recorded check is what lets a redelivered group commit at all, not
// what stops a double apply: without it the group's second record of a
// job would break keylane_outcomes' primary key (and the shop's order,
// its UNIQUE job_id), so the group would fail on every try instead.
//
// TestPipelineSendsTheGroupInTwoRoundTrips counts the round trips with
// a pgx tracer: a Handler's group of 11 jobs took 20 or more, the
// pipeline's 2 on a pool and 3 on one connection.
// TestPipelineFailingJobRollsBackAlone,
// TestPipelineAnswersRecordedJobsFromTheRecord and
// TestPipelineStaleFenceChangesNothing hold the fast path to Apply's
// answers in each failure. Every worker-level fault test of this package
// (a worker SIGKILLed or cut off between commit and ack, a paused owner
// refused by the fence, a Postgres restart, a connection cut mid-group,
// the database killed) runs for every kind, as subtests "handler",
// "pipeline" and "set"; TestPipelineConnectionCut cuts the connection after the
// fast path's batch, after the record and after COMMIT, and
// TestPausedWorkerRefusedByFence/pipeline/unapplied has the paused owner's
// jobs unrecorded when it resumes, so only the fence refuses them (with
// the fast path's fence check removed it failed: "paused worker's
// transaction ... ended with <nil>, want a StaleFenceError").
//
// # Set handlers
//
// A PipelineHandler's statements are one or more a job, and the server
// parses, plans and executes each: a transaction's work grows by a
// statement's overhead a job. A SetHandler's are a few a transaction: Read
// queues what the jobs need to know (shop.SellSet: one SELECT … FOR UPDATE
// of every SKU's stock row), and the Write it returns, called once those
// ran, decides every job in Go, in order, from what was read (the stock
// left after each purchase, so a sold-out SKU refuses the next buyer) and
// queues the writes of all of them (shop.SellSet: one INSERT … SELECT
// FROM unnest … ON CONFLICT DO UPDATE of the changed stock rows, one
// INSERT … SELECT FROM unnest of the order rows). ApplySet runs, on a
// *pgxpool.Pool:
//
//  1. One round trip: BEGIN; the fence; the outcomes look-up; Read's
//     statements, for the jobs of the group that run (not those of held
//     keys).
//  2. The fence refused: roll back, *StaleFenceError. A job recorded, one
//     ID twice, Read's error or panic, or a read that failed: roll back
//     and take the careful path.
//  3. Write: its error or panic, or a job's SetResult.Err: roll back, the
//     careful path. Otherwise one message: Write's statements, the record
//     of every job's outcome, COMMIT. A write that fails at the server
//     skips the rest (the transaction is aborted, nothing commits) and the
//     careful path follows; a cut connection after the message leaves the
//     commit's fate unknown, an error as for any group
//     (TestPipelineConnectionCut/set cuts after the read, the writes, the
//     record and COMMIT).
//
// On another DB, three round trips: the writes and the record in one,
// COMMIT in its own. The careful path is Apply's, with each job a set of
// one (Read, its statements, Write, its statements) in its own savepoint:
// a failing job fails alone, the rest commit. Read and Write may so run
// more than once for a job; like a PipelineHandler's Queue, they must be
// free of side effects and depend only on the jobs and the rows. A Read
// that returns no Write, or a Write that returns a result count other
// than its jobs', fails the job for good (keylane.ErrPermanent): no retry
// returns another answer (TestSetHandlerBugsFailForGood).
//
// Write decides from the rows Read locked: keylane serializes the keys'
// jobs, and FOR UPDATE makes a writer outside keylane wait, so no
// decision rests on a row that changes before COMMIT. A Write that
// decided without locking its rows would sell stock another writer
// already sold: lock what you read. Writing conditionally is no way out:
// Write's results are fixed before its statements run, they go with
// COMMIT, and a write that matches no row commits the job's result all
// the same; so Write's statements may carry no pgx callback (refused for
// good with ErrWriteCallback, TestSetWriteCallbacksAreRefused), and only
// a write the server refuses fails the job
// (TestSetWriteFailureTakesTheCarefulPath). A panic in a read's callback
// fails its job alone and leaves no session in the transaction
// (TestCallbackPanicFailsTheJobAlone, for pipelines too).
//
// TestSetSendsTheGroupInTwoRoundTrips holds a set of 44 jobs to 2 round
// trips and 8 statements on a pool, 3 round trips on a connection, with
// the pipeline's outcomes and rows; TestSetMatchesSell applies random
// groups of the shop's commands through Sell and SellSet and compares
// every outcome and row (seeded: KEYLANE_SEED); TestSetFailingJobFailsAlone
// fails a job at each step of Read and Write. Every worker-level fault
// test of this package runs for "set" too, beside "handler" and
// "pipeline".
//
// # What a crash leaves
//
// Before COMMIT (the worker killed or cut off, the connection broken, the
// database restarted): the server rolls the transaction back when the
// session ends. Nothing of the group is written, no outcome recorded, and
// the redelivered jobs run again from the start: once.
//
// A transaction that does not commit (a stale fence, the careful path's
// turn, a failed job or record) ends with a ROLLBACK bounded by 5s
// whatever the caller's context says: a server that takes it and never
// answers does not hold Apply, and the worker's lane, for ever; pgx then
// closes the connection and the server rolls back when it sees it go
// (TestRollbackIsBounded).
//
// COMMIT answered with an error (a deferred constraint broken): the
// server rolled the transaction back, a known fate; Apply applies the
// group again with each job's deferred constraints checked at its end,
// and the job that broke one fails alone.
//
// During COMMIT (the reply lost): the group committed or not, and Apply
// cannot tell; it returns an error, and the worker must neither reply nor
// ack. The redelivery (or Apply of the same group) finds the outcomes if
// it committed and applies the jobs if not: once either way.
//
// After COMMIT, before the ack: the redelivered jobs are answered from
// keylane_outcomes and not applied again; a client retrying a job by ID
// finds its result with Lookup. Outcomes and the writes they stand for
// commit together, so neither exists without the other.
//
// A database crash keeps every transaction whose COMMIT returned, with the
// server's default synchronous_commit=on. With synchronous_commit=off a
// crash can lose the last commits after the worker acked and replied: the
// buyer was told "sold" and the database has no order. Keep it on where a
// reply must be true.
//
// # The fence
//
// Fences grow across a partition's owners (keylane's lease fencing
// tokens); one owner's groups carry one fence. The fence row of
// (namespace, partition) is locked by the first statement of every
// transaction and held to its end, so a partition's transactions run one
// at a time, and in READ COMMITTED a transaction that waited for the lock
// re-checks the condition against the row as committed by the one before.
// Hence the committed transactions of a partition form a sequence in
// which the fence never decreases: a deposed owner's transaction commits
// only before its successor's first one (and the successor, reading
// outcomes after the lock, then sees what it applied and does not apply it
// again), or it fails with a StaleFenceError without writing anything. No
// clock, lease time or pause length enters into it.
//
// The lock is held while the group runs: an owner paused mid-group (a
// stopped process, a long GC pause) keeps its successor waiting until it
// resumes and fails. With IdleTimeout the database ends a session idle in
// its transaction for longer than the timeout, so the successor goes on
// and the paused owner's transaction is rolled back; set it below the
// lease's TTL.
//
// # What a Handler may and may not do
//
// It may read and write anything through the tx it is given, any number
// of statements, and nest its own savepoints (tx.Begin); it returns the
// job's result, recorded as given (nil is recorded as empty). A refusal
// that is an answer (sold out) is a result, not an error.
//
// It must not:
//   - commit or roll back the transaction (the tx refuses: ErrTxOwned), nor
//     send COMMIT, ROLLBACK, BEGIN, SAVEPOINT, RELEASE or the like through
//     it (refused before they are sent, wherever they sit in the string,
//     with a permanent ErrTxOwned: TestTransactionControlIsRefused; its own
//     savepoints go through tx.Begin), nor escape it through tx.Conn();
//   - write through another connection or pool: such writes are not in the
//     transaction, so not undone with it, not fenced, not exactly once;
//   - have side effects outside the database that must happen once (mail,
//     HTTP calls, another system's writes): a job may run and be rolled
//     back (its own failure, a crash, a stale fence) and then run again.
//     Write the intent to an outbox table through tx instead;
//   - swallow a database error: the transaction is then aborted, and the
//     whole group fails instead of the one job; the worker tries the job
//     alone, and dead-letters it past MaxDeliver such tries;
//   - change the transaction's isolation or leave session settings behind
//     (SET without LOCAL): the connection goes back to the pool;
//   - run long: the partition's fence row is locked meanwhile, and every
//     job of the group waits for the slowest.
//
// Rows that something other than keylane also writes need the usual care
// (a conditional UPDATE, a row lock): keylane serializes only its own jobs
// of a key.
//
// Savepoints cost no round trip (the roll rides on a job's first
// statement), but PostgreSQL keeps the IDs of at most 64 subtransactions
// that wrote per transaction in shared memory: a transaction of more
// writing jobs overflows that cache, which slows the snapshots of the
// server's other sessions while it runs. Applier, with MaxJobs at its default or at most 64, never lets it
// (MaxJobs, TestApplierCapsJobsPerTransaction); a caller of Apply keeps
// its groups at 64 jobs or fewer itself.
//
// # Keeping outcomes
//
// An outcome must be kept as long as its job can come back: redeliveries
// (MaxDeliver), the jobs stream's retention and duplicate window for a
// resubmission with the same ID. Prune deletes the older ones; a pruned job
// that comes back is applied again.
//
// keylane's worker prunes by itself (keylane.RecordPruner): with
// Applier.Retention (DefaultRetention, a day, unless set; negative turns
// it off), a lease TTL after it starts and then every 24th of the
// retention (between a minute and an hour). Start refuses a retention
// shorter than keylane.MinRecordRetention: the results TTL, the duplicate
// window and (MaxDeliver+2) × (AckWait + lease TTL), the longest a
// committed job's redeliveries last while its partition is owned. And no
// prune deletes an outcome recorded after the oldest job still in the
// jobs streams was published (less a minute): a job unacked for longer
// than the retention (no worker, or the database down, for that long)
// keeps its outcome (TestRecordPruneSparesPendingJobs in keylane,
// TestWorkerPrunesOutcomes here: a late redelivery after a prune is
// answered from the record).
//
// Prune deletes in transactions of PruneBatch (1000) outcomes, the oldest
// first through keylane_outcomes_at, and pauses between two as long as
// the last took; it takes no lock a partition's transaction waits for.
// BenchmarkPruneBesideApply prunes 500,000 day-old outcomes while groups
// of 16 purchases (shop.SellSet) apply one after another, on a shared
// 2-core VM under a load average of about 20 (2026-11-29):
//
//	cd pg && go test -run '^$' -bench BenchmarkPruneBesideApply -benchtime 1x -count 2 .
//
//	                      group p50   group p99   group max   prune
//	alone (3 s)           3.2–5.5 ms  101–102 ms  225–293 ms
//	while pruning         4.8–6.1 ms  90–106 ms   228–495 ms  29–33 s, 14,900–17,300 outcomes/s
//
// Unpaced it pruned 21,400 outcomes/s and doubled the groups' p99 (78 to
// 180 ms). The index costs each record one more B-tree entry at its
// right end; BenchmarkRecordIndexCost sets it beside none, and on that
// loaded machine its runs spread wider (970 to 3,088 jobs/s for one
// setting) than any difference between the two.
//
// # Speed
//
// The bench module's Postgres rows set keylane in front of PostgreSQL
// beside PostgreSQL alone (a conditional UPDATE; a FOR UPDATE transaction
// that also inserts the order), a throwaway postgres per run, in one
// interleaved run of 3:
//
//	cd bench && go run . --only postgres --markdown
//
// keylane's rows apply through shop.SellSet (two round trips and 9
// statements a transaction, on a pool), on one partition whose Applier
// runs 64 keys at once, and send batch messages and no caller's ID (the
// database keeps the outcome), corked 1 ms when NATS syncs
// (keylane.ClientConfig.BatchCork); docs/speed.md, "keylane → Postgres",
// measures each of these alone. On a quiet 2-core VM (2026-11-27), 64
// buyers, durable (synchronous_commit=on, and keylane's NATS server
// syncing every write), jobs/s, the medians of 3 interleaved runs:
//
//	                          keylane Call   keylane Submit   UPDATE   FOR UPDATE tx
//	hot SKU                   14,793         31,992           2,103    979
//	10k SKUs zipf, in stock   10,823         20,940           6,867    3,338
//	10k SKUs zipf, sell-out   10,918         21,452           10,777   4,092
//
// The targets are met: the hot SKU's Call does 15.1× the FOR UPDATE
// transaction (target 10×) and 7.0× the UPDATE (target 5×); the skewed
// catalog's, 1.58× the UPDATE (target 1.5×) on the set-up, the
// skewed-ample sale, whose SKUs stay in stock and whose hot rows stay
// contended all run (pgbench, docs/pgbench.sh, gives the UPDATE 6,203 to
// 7,085 here on the same sale). On the sale whose hottest SKUs sell out
// in its first third, the UPDATE of a sold-out SKU writes and flushes
// nothing while keylane records every purchase's outcome, and the Call
// only draws level (1.01×). Zero oversell and one order row per unit
// sold held in every run of every row.
//
// What bounds the skewed durable Call is a partition's transaction cycle,
// and behind it the machine's CPU (docs/speed.md measures each stage with
// the bench's KEYLANE_BENCH_STAGES): two round trips, the second with the
// commit's WAL flush (469 µs and 795 µs with shop.SellSet), one after
// another, and 64 buyers leave a transaction about 17 jobs. A set handler
// cut the server's work a job (BenchmarkApplyManySKUs: a transaction of
// 128 jobs 4.19 ms as a pipeline, 2.54 ms as a set), not the cycle. More
// partitions run transactions at once, but each sends its own batch
// messages, which the jobs stream syncs one after another: two made the
// skewed-ample Call 7,672 jobs/s against 11,093 with one (one-row runs:
// cd bench && KEYLANE_BENCH_PG_PARTITIONS=2 KEYLANE_BENCH_STAGES=1 go run
// . --only 'skewed-ample,postgres keylane' --buyers 64 --runs 1
// --placement embedded, against the same without the partitions);
// 16 (the namespace
// default) made it 2,228 against 10,825 before set handlers. The disk is
// not the bound: it syncs 4,569 writes a second with one writer and
// 9,285 with four (BenchmarkFsync in the bench module). Tried and not
// kept (docs/speed.md): a worker-side cork on the transaction, several
// transactions in flight per partition (they serialize on the fence row;
// with a shared lock on it, smaller transactions and more commits), more
// jobs streams.
//
// # Another SQL database
//
// The protocol needs transactions, savepoints, a unique key and a row lock
// taken by a conditional write; MySQL and MariaDB (InnoDB) through
// database/sql have them all, and a package keylanemysql would offer the
// same Group, Outcome, Status and Apply, with a Handler taking a *sql.Tx:
//
//   - BeginTx with sql.LevelReadCommitted;
//   - the fence: INSERT IGNORE the (namespace, partition) row, then SELECT
//     fence … FOR UPDATE (a locking read sees the newest committed row, not
//     the snapshot), compare in Go, and UPDATE it, or roll back with the
//     stale-fence error;
//   - outcomes: SELECT … WHERE namespace = ? AND job_id IN (…), after the
//     lock; one multi-row INSERT before COMMIT; result a LONGBLOB;
//   - savepoints: SAVEPOINT, ROLLBACK TO SAVEPOINT, RELEASE SAVEPOINT, each
//     its own round trip (no multi-statement by default). One difference
//     to handle: an InnoDB deadlock rolls back the whole transaction, not
//     the statement, so a job failing that way fails its group.
//
// The shared types would then move to a driver-free package; with one
// driver they live here.
package keylanepg
