// Package lanes runs the fetched jobs of one partition: one queue (lane)
// per resource key, served by a fixed pool of runners, and the partition's
// in-flight window. A key's jobs run one at a time (or a group at a time,
// for group commit) in the order they were stored; different keys run in
// parallel on up to Config.Runners goroutines; a hot key yields its runner
// after a burst when other lanes wait. The package is pure: it knows no
// NATS, no lease and no handler. It decides which job runs when and which
// jobs go back to the server; its caller fetches, acks and NAKs.
//
// # What it queues
//
// Lanes is generic over the task it queues, constrained by Task: the
// engine's task (a fetched message, its Job and the engine's bookkeeping)
// stays the engine's, and Config.Run receives the engine's own []T, with
// no conversion and no boxing per job. Task is the little the lanes read:
// the job's Position (stream sequence, index in a batch message), its key,
// whether it is a part of a batch message of several jobs (never handed
// back alone), and its maybe-duplicate flag, which a hand-back must carry
// across the round trip. What the lanes write on a task lives in a Mark
// the task carries and hands out (Task.Mark): when its progress was last
// reported (Touch) and whether its runner put it back (Requeue).
//
// # The window and a failing key
//
// The lanes hold at most Config.Window fetched jobs (MaxInFlight),
// whatever message they came in; the fetch loop calls WaitRoom before it
// reads the next message, so a batch of several jobs may take the window
// past its size by its own jobs. A key whose head job fails and retries
// is stalled (Stall): its head leaves the window and waits out each
// backoff in Pause without holding a runner's place, it keeps at most
// min(16, Window/2) queued jobs that came alone (a batch of one), and the
// rest of those, and its later arrivals so, are handed back (Add and Stall report them; the
// caller NAKs them with a delay). The jobs handed back and not yet
// returned are the lane's gap: only queued jobs below it run, so the key's
// order holds. Once the head settled every returning job is taken,
// whatever its order, so the gap closes within the longest NAK delay.
//
// Failure cases it handles, each tested here:
//
//   - A full window that nothing can free (no runner runs a job that is
//     not a stalled head, no lane is ready): WaitRoom hands back the
//     highest job waiting behind a gap, else the highest job kept by the
//     stalled key keeping the most jobs that came alone, which then keeps
//     none until its head settles (TestLanesWindowBehindAGapHandsBackTheHighest,
//     TestLanesStalledKeysGiveTheirKeptJobsBack). A key keeping only jobs
//     of batches of several is passed over: they cannot be handed back
//     alone (a message is acked or NAKed whole). When nothing is left to
//     hand back, WaitRoom lets the next message in over the window
//     (Overflow), so a healthy key's job is still fetched and runs
//     (TestLanesWindowOfBatchPartsLetsTheNextIn).
//   - Returns in any order while the key's traffic goes on
//     (TestLanesGapClosesWhateverTheReturnOrder).
//   - A runner waiting out a backoff frees its place for other keys, and
//     the runners back from backoffs never run more than Config.Runners
//     jobs at once (TestLanesPausedRunnerLetsOthersRun).
//   - A redelivery of a job still in flight is refused: the original's
//     ack covers it (TestLanesRefuseDuplicateInFlight).
//   - A re-synchronisation closes the lanes dropping their queued jobs
//     (Close(true)); a backoff in progress ends at once
//     (TestLanesCloseDropsQueued, TestLanesDroppingCloseEndsABackoff).
//
// How this serves the worker, and the whole-worker tests that show it,
// is written down in jetstream/doc.go, "Running jobs" and "A failing key
// does not hold its partition".
package lanes
