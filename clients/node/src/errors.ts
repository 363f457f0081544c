// The errors the client throws: one class, KeylaneError, whose `code`
// names the Go client's sentinel error it stands for (see README.md,
// "Errors"), and subclasses for the errors that carry more.

/**
 * The kinds of error, each the Go client's error of the same meaning:
 *
 * - bad_key: partition.ErrEmptyKey, ErrKeyTooLong, ErrKeyNotUTF8,
 *   ErrKeyControl, ErrKeySpace (nothing sent)
 * - bad_job_id: ErrBadJobID (nothing sent)
 * - bad_type: ErrBadType (nothing sent)
 * - reserved_header: ErrReservedHeader (nothing sent)
 * - bad_header: ErrBadHeader (nothing sent)
 * - payload_too_large: ErrPayloadTooLarge (nothing sent)
 * - bad_namespace: a namespace name that is not ^[a-z][a-z0-9_-]{0,31}$
 *   (the Go client's plain error; nothing sent)
 * - no_topology: ErrNoTopology (the namespace is not set up, or the
 *   stream under its name takes another namespace's subjects)
 * - partition_mismatch: ErrPartitionMismatch
 * - shards_mismatch: ErrShardsMismatch
 * - max_deliver_mismatch: ErrMaxDeliverMismatch (a malformed
 *   keylane.max-deliver)
 * - batches_mismatch: ErrBatchesMismatch (a bad keylane.batches value)
 * - old_jobs_stream: ErrOldJobsStream
 * - duplicate: ErrDuplicate (submit, on a namespace with a key backlog
 *   cap: refused at the cap while a job with this ID is still queued or
 *   was applied; nothing new stored)
 * - batch_id_used: the server had a message under the batch's ID before
 *   the batch's first copy: not stored (Go: "batch ID already used")
 * - key_backlog_full: ErrKeyBacklogFull (nothing stored)
 * - no_reply: ErrNoReply (call: no outcome before the timeout; call again
 *   with the same id)
 * - held: ErrHeld (the worker holds the job until an operator acts)
 * - remote: RemoteError (the handler's error)
 * - no_result: ErrNoResult (result: nothing kept under that ID)
 * - closed: ErrClosed
 * - refused: the server refused the publish (its error is in the message)
 * - unknown_outcome: whether the job was stored or applied is unknown
 *   (e.g. no stream ack before the timeout); retry with the same id
 * - aborted: the caller's AbortSignal fired (Go: context.Canceled):
 *   AbortedError, whose sent says whether anything was published
 * - bad_delay: ErrBadDelay (a negative delay, one over 30 days, a run-at
 *   time over a second in the past; nothing sent)
 * - delays_off: ErrDelaysOff (a delayed job on a namespace made without
 *   delays; nothing sent)
 * - delayed_call: ErrDelayedCall (call takes no delay; nothing sent)
 */
export type ErrorCode =
  | "bad_key"
  | "bad_job_id"
  | "bad_type"
  | "reserved_header"
  | "bad_header"
  | "payload_too_large"
  | "bad_namespace"
  | "no_topology"
  | "partition_mismatch"
  | "shards_mismatch"
  | "max_deliver_mismatch"
  | "batches_mismatch"
  | "old_jobs_stream"
  | "duplicate"
  | "batch_id_used"
  | "key_backlog_full"
  | "no_reply"
  | "held"
  | "remote"
  | "no_result"
  | "closed"
  | "refused"
  | "unknown_outcome"
  | "aborted"
  | "bad_delay"
  | "delays_off"
  | "delayed_call";

/** KeylaneError is every error the client throws on its own account. */
export class KeylaneError extends Error {
  readonly code: ErrorCode;
  /** The job's ID, when the error is about one job. */
  readonly jobId?: string;

  constructor(code: ErrorCode, message: string, jobId?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KeylaneError";
    this.code = code;
    this.jobId = jobId;
  }
}

/** RemoteError is a handler's error as a call receives it. */
export class RemoteError extends KeylaneError {
  /** The handler's error text. */
  readonly remoteMessage: string;
  /** The handler marked it permanent (or the job was dead-lettered). */
  readonly permanent: boolean;
  /** The job was moved to the dead-letter stream. */
  readonly deadLettered: boolean;

  /** "error", "permanent" or "dead" (dead-lettered), as Keylane-Error-Kind says. */
  get kind(): "error" | "permanent" | "dead" {
    return this.deadLettered ? "dead" : this.permanent ? "permanent" : "error";
  }

  constructor(message: string, permanent: boolean, deadLettered: boolean, jobId?: string) {
    super("remote", (deadLettered ? "keylane: job failed (dead-lettered): " : "keylane: job failed: ") + message, jobId);
    this.name = "RemoteError";
    this.remoteMessage = message;
    this.permanent = permanent || deadLettered;
    this.deadLettered = deadLettered;
  }
}

/** NoReplyError: a call's timeout ended before the job's outcome came. */
export class NoReplyError extends KeylaneError {
  constructor(jobId: string, why: string) {
    super("no_reply", `keylane: no result before the timeout (job ${jobId}): ${why}; call again with the same id for its outcome`, jobId);
    this.name = "NoReplyError";
  }
}

/** HeldError: the worker holds the stored job until an operator acts. */
export class HeldError extends KeylaneError {
  readonly reason: string;
  /** Held for a key written under another jobs stream (Go's ErrEpoch). */
  readonly epoch: boolean;

  constructor(jobId: string, reason: string, epoch: boolean) {
    super("held", `keylane: job ${jobId} is stored but held, not run: ${reason}; call again with the same ID for its outcome once it runs`, jobId);
    this.name = "HeldError";
    this.reason = reason;
    this.epoch = epoch;
  }
}

/** KeyBacklogFullError: the key has its namespace's cap of jobs queued. */
export class KeyBacklogFullError extends KeylaneError {
  readonly key: string;
  readonly cap: number;

  constructor(key: string, cap: number, jobId?: string) {
    super("key_backlog_full", `keylane: key ${JSON.stringify(key)} backlog full: it already has ${cap} jobs waiting or running (the namespace's key backlog cap); refused, nothing stored`, jobId);
    this.name = "KeyBacklogFullError";
    this.key = key;
    this.cap = cap;
  }
}

/**
 * AbortedError: the caller's AbortSignal fired. Its name is "AbortError",
 * as for fetch and the rest of Node's API; cause is the signal's reason.
 * sent false: nothing was published (nothing stored). sent true: the job
 * was published, and whether it was stored (or ran) is unknown, as after
 * a timeout: submit or call again with the same id.
 */
export class AbortedError extends KeylaneError {
  readonly sent: boolean;

  constructor(what: string, jobId: string | undefined, sent: boolean, reason: unknown) {
    super(
      "aborted",
      sent
        ? `keylane: ${what}${jobId ? " " + jobId : ""}: aborted after it was sent: stored or not, unknown; ${what === "call" ? "call" : "submit"} again with the same id`
        : `keylane: ${what}${jobId ? " " + jobId : ""}: aborted before it was sent: nothing stored`,
      jobId,
      { cause: reason },
    );
    this.name = "AbortError";
    this.sent = sent;
  }
}
