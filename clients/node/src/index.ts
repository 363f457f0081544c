// @keylane/client: submit and call keylane jobs from Node.js.
export { Client, connect } from "./client.js";
export type { ConnectOptions, JobOptions, ManyJob, NamespaceInfo, OpenOptions, Submitted } from "./client.js";
export { AbortedError, HeldError, KeyBacklogFullError, KeylaneError, NoReplyError, RemoteError } from "./errors.js";
export type { ErrorCode } from "./errors.js";
export {
  HashName,
  Header,
  Names,
  backlogFull,
  classOf,
  buildJob,
  markRetry,
  parseStreamAck,
  transient,
  heldSubject,
  validPartitionCount,
  decodeKept,
  decodeReply,
  jobsSubject,
  keyHash,
  keyToken,
  partitionOf,
  validJobID,
  validReply,
  validateJobID,
  validateKey,
  validateType,
  validateUserHeader,
  batchOutcomesKey,
  decodeBatchOutcomes,
  findBatchOutcome,
  parseBatchedJobID,
  validBatchID,
  batchJobOf,
  batchJobSize,
  batchSubject,
  batchedJobID,
  delaySubject,
  formatRunAt,
  MaxDelay,
  RunAtTolerance,
  runAtDecision,
  buildBatch,
  decodeBatch,
  encodeBatch,
} from "./wire.js";
export type { AckClass, BatchJob, BatchOptions, BatchMessage, BatchOutcome, JobInput, JobMessage, NamespaceSettings, Outcome, StreamAck } from "./wire.js";
export { xxhash64 } from "./xxhash64.js";
