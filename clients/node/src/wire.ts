// keylane's wire rules, as the Go code applies them (package partition,
// package wire, names.go, wire.go): key and job ID validation, the key's
// hash, token and partition, subjects and object names, and the outcome
// encodings. Pure functions; nothing here talks to a server.

import { KeylaneError, RemoteError } from "./errors.js";
import { xxhash64 } from "./xxhash64.js";

/** Header names on job and reply messages (package wire). */
export const Header = {
  JobID: "Nats-Msg-Id",
  Key: "Keylane-Key",
  Type: "Keylane-Type",
  Reply: "Keylane-Reply",
  Error: "Keylane-Error",
  ErrorKind: "Keylane-Error-Kind",
  Partitions: "Keylane-Partitions",
  Idempotent: "Keylane-Idempotent",
  KeepOutcome: "Keylane-Keep-Outcome",
  ExpectedStream: "Nats-Expected-Stream",
  /** A batch message's body format version ("1"). */
  Batch: "Keylane-Batch",
  /** A batch message's job count (decimal). */
  BatchJobs: "Keylane-Batch-Jobs",
  /** A delayed job's due time (RFC 3339, UTC), on its submission. */
  RunAt: "Keylane-Run-At",
} as const;

/** Metadata keys of the jobs stream (meta.go). */
export const Meta = {
  Partitions: "keylane.partitions",
  Hash: "keylane.hash",
  Version: "keylane.version",
  ReplyPrefix: "keylane.reply-prefix",
  Shards: "keylane.shards",
  Shard: "keylane.shard",
  Batches: "keylane.batches",
  Delays: "keylane.delays",
  /** Workers': attempts before a dead letter (decimal, at least 1). */
  MaxDeliver: "keylane.max-deliver",
  /** Workers': which jobs stream this is (hexadecimal, 1..2^64-1). */
  Epoch: "keylane.epoch",
  /** Workers': the earlier streams' epochs it carries on (hexadecimal, comma-separated). */
  Adopted: "keylane.adopted",
} as const;

export const HashName = "xxhash64-mod";
/**
 * keylane.version of a jobs stream with per-key subjects whose every job
 * is in a batch message (the one message format). "3" could hold one-job
 * messages, which workers now refuse: such a stream is refused.
 */
export const SubjectsVersion = "4";
/** keylane.version of a stream whose clients could store one-job messages. */
export const OneJobVersion = "3";
export const MaxKeyLen = 1024;
export const MaxPartitions = 4096;
export const MaxStreamShards = 64;
export const MaxJobIDLen = 256;
export const MaxTypeLen = 256;
export const MaxHeaderNameLen = 256;
/** Room left under max_payload for what a dead letter adds. */
export const DeadLetterReserve = 2048;
export const DefaultNamespace = "keylane";
/** How far after now a delayed job may be due: 30 days, in ms (wire.MaxDelay). */
export const MaxDelay = 30 * 24 * 3600 * 1000;
/** How far in the past a run-at time may be (it then runs at once), in ms (RunAtTolerance). */
export const RunAtTolerance = 1000;
export const DefaultReplyPrefix = "_INBOX.";

const enc = new TextEncoder();

export function utf8(s: string): Uint8Array {
  return enc.encode(s);
}

export function byteLength(s: string): number {
  return Buffer.byteLength(s, "utf8");
}

// Go's unicode.IsControl: C0, DEL and C1 (Latin-1 only).
function isControl(cp: number): boolean {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

// Go's unicode.IsSpace.
function isSpace(cp: number): boolean {
  switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x20: case 0x85: case 0xa0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
      return true;
  }
  return cp >= 0x2000 && cp <= 0x200a;
}

// wellFormed reports whether s has no lone surrogate: only then is it
// valid UTF-8 once encoded (a lone surrogate would become U+FFFD).
function wellFormed(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (!(d >= 0xdc00 && d <= 0xdfff)) return false;
      i++;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return false;
    }
  }
  return true;
}

function clip(s: string): string {
  return s.length <= 64 ? s : s.slice(0, 64) + "…";
}

function codePoints(s: string): number[] {
  return Array.from(s, (ch) => ch.codePointAt(0)!);
}

/** validateKey throws bad_key unless key is a valid resource key. */
export function validateKey(key: unknown): asserts key is string {
  if (typeof key !== "string" || key === "") {
    throw new KeylaneError("bad_key", "partition: key is empty");
  }
  if (!wellFormed(key)) {
    throw new KeylaneError("bad_key", "partition: key is not valid UTF-8");
  }
  const n = byteLength(key);
  if (n > MaxKeyLen) {
    throw new KeylaneError("bad_key", `partition: key longer than 1024 bytes (${n} bytes)`);
  }
  const cps = codePoints(key);
  for (const cp of cps) {
    if (isControl(cp)) {
      throw new KeylaneError("bad_key", "partition: key contains a control character");
    }
  }
  if (isSpace(cps[0]) || isSpace(cps[cps.length - 1])) {
    throw new KeylaneError("bad_key", `partition: key starts or ends with white space (got ${JSON.stringify(clip(key))})`);
  }
}

/** validJobID: 1 to 256 of A-Z a-z 0-9 _ - = and dots, no dot first, last or next to another. */
export function validJobID(id: unknown): id is string {
  return typeof id === "string" && /^[A-Za-z0-9_=-]+(\.[A-Za-z0-9_=-]+)*$/.test(id) && id.length <= MaxJobIDLen;
}

export function validateJobID(id: unknown): asserts id is string {
  if (!validJobID(id)) {
    throw new KeylaneError("bad_job_id", `keylane: job ID must be 1-256 characters of A-Z a-z 0-9 _ - = and single inner dots (got ${JSON.stringify(clip(String(id)))})`);
  }
}

/** validateType: up to 256 bytes of UTF-8, no control character, no white space at either end; "" is none. */
export function validateType(typ: string): void {
  let ok = typeof typ === "string" && wellFormed(typ) && byteLength(typ) <= MaxTypeLen;
  if (ok && typ !== "") {
    const cps = codePoints(typ);
    ok = !cps.some(isControl) && !isSpace(cps[0]) && !isSpace(cps[cps.length - 1]);
  }
  if (!ok) {
    throw new KeylaneError("bad_type", `wire: job type must be at most 256 bytes of UTF-8 without control characters or white space at either end (got ${JSON.stringify(clip(String(typ)))})`);
  }
}

function hasPrefixFold(s: string, prefix: string): boolean {
  return s.length >= prefix.length && s.slice(0, prefix.length).toLowerCase() === prefix.toLowerCase();
}

/** validateUserHeader: a submitter's own header, by package wire's rule. */
export function validateUserHeader(name: string, value: string): void {
  if (hasPrefixFold(name, "Nats-") || hasPrefixFold(name, "Keylane-") || name.toLowerCase() === "status" || name.toLowerCase() === "description") {
    throw new KeylaneError("reserved_header", `wire: header is reserved (Nats-* for the server, Keylane-* for keylane, Status and Description for the NATS clients): ${JSON.stringify(clip(name))}`);
  }
  let nameOK = name.length > 0 && name.length <= MaxHeaderNameLen;
  for (let i = 0; nameOK && i < name.length; i++) {
    const c = name.charCodeAt(i);
    nameOK = c >= 33 && c <= 126 && !`"()/,:;<=>?@[\\]{}`.includes(name[i]);
  }
  if (!nameOK) {
    throw new KeylaneError("bad_header", `wire: header name ${JSON.stringify(clip(name))} is not valid`);
  }
  const sp = (c: string) => c === " " || c === "\t" || c === "\r" || c === "\n";
  const valueOK = typeof value === "string" && !/[\r\n\0]/.test(value) && (value === "" || (!sp(value[0]) && !sp(value[value.length - 1])));
  if (!valueOK) {
    throw new KeylaneError("bad_header", `wire: header ${name} value ${JSON.stringify(clip(String(value)))} would not arrive as sent`);
  }
}

/** validateReply: a plain subject under prefix (ValidateReply). */
export function validReply(reply: string, prefix: string): boolean {
  if (prefix === "" || reply.length <= prefix.length || !reply.startsWith(prefix)) return false;
  for (const tok of reply.slice(prefix.length).split(".")) {
    if (tok === "" || tok === "*" || tok === ">" || /[\x00-\x20\x7f]/.test(tok)) return false;
  }
  return true;
}

/** keyHash is the key's XXH64 (seed 0) over its UTF-8 bytes. */
export function keyHash(key: string): bigint {
  return xxhash64(utf8(key));
}

/** keyToken is the key's subject token: its hash as 16 lowercase hex digits. */
export function keyToken(key: string): string {
  return keyHash(key).toString(16).padStart(16, "0");
}

/** partitionOf is the key's partition among n: hash mod n. */
export function partitionOf(key: string, n: number): number {
  return Number(keyHash(key) % BigInt(n));
}

/** jobsSubject is where a job of key goes: <ns>.jobs.<p>.<token>. */
export function jobsSubject(namespace: string, p: number, key: string): string {
  return `${namespace}.jobs.${p}.${keyToken(key)}`;
}

/**
 * delaySubject is where a delayed job's submission goes:
 * <ns>.delay.<p>.<id~>, the job ID with every "." replaced by "~"
 * (partition.DelaySubject); p is its key's partition.
 */
export function delaySubject(namespace: string, p: number, id: string): string {
  return `${namespace}.delay.${p}.${id.replaceAll(".", "~")}`;
}

/**
 * formatRunAt writes t as Go's time.RFC3339Nano in UTC: no fraction when
 * it is whole seconds, else the fraction without trailing zeros
 * ("2026-11-27T12:00:00Z", "2026-11-27T12:00:00.25Z").
 */
export function formatRunAt(t: Date): string {
  return t.toISOString().replace(/\.?0*Z$/, "Z");
}

/**
 * runAtDecision reads a job's delay options at now (ms) as the Go
 * client's WithDelay and WithRunAt do (PROTOCOL.md § 13, delays.json's
 * run_at_rules): null for a job due now (no delay, a delay of 0, a
 * run-at time up to RunAtTolerance in the past: it is sent at once as any
 * job, on any namespace); bad_delay for a negative or non-finite delay,
 * one beyond MaxDelay, a run-at time further in the past or beyond
 * MaxDelay; delays_off for a job in the future on a namespace that takes
 * no delayed jobs. Otherwise the run-at time.
 */
export function runAtDecision(opts: { delay?: number; runAt?: Date; id?: string }, now: number, ns: { namespace: string; delays: boolean }): Date | null {
  let runAt: Date | null = null;
  if (opts.delay !== undefined) {
    const d = opts.delay;
    if (typeof d !== "number" || !Number.isFinite(d) || d < 0 || d > MaxDelay) {
      throw new KeylaneError("bad_delay", `keylane: bad delay: ${String(d)} ms must be 0 to ${MaxDelay} (30 days)`, opts.id);
    }
    if (d > 0) runAt = new Date(now + d);
  }
  if (opts.runAt !== undefined) {
    const t = opts.runAt;
    if (!(t instanceof Date) || Number.isNaN(t.getTime())) {
      throw new KeylaneError("bad_delay", `keylane: bad delay: runAt must be a valid Date (got ${String(t)})`, opts.id);
    }
    runAt = t;
  }
  if (runAt === null) return null;
  const until = runAt.getTime() - now;
  if (until < -RunAtTolerance) {
    throw new KeylaneError("bad_delay", `keylane: bad delay: run-at ${runAt.toISOString()} is ${-until} ms in the past (tolerance ${RunAtTolerance} ms)`, opts.id);
  }
  if (until > MaxDelay) {
    throw new KeylaneError("bad_delay", `keylane: bad delay: run-at ${runAt.toISOString()} is beyond 30 days from now`, opts.id);
  }
  if (until <= 0) return null; // due: it runs at once
  if (!ns.delays) {
    throw new KeylaneError("delays_off", `keylane: namespace ${ns.namespace} takes no delayed jobs: it was created without them (a namespace takes them when the worker that creates it runs with --delays: worker --namespace NAME --delays)`, opts.id);
  }
  return runAt;
}

/** shardOf is the jobs stream shard that holds partition p among s. */
export function shardOf(p: number, s: number): number {
  return p % s;
}

/** Object names of a namespace (names.go). */
export class Names {
  constructor(readonly namespace: string) {}
  private upper(): string {
    return this.namespace.replaceAll("-", "_").toUpperCase();
  }
  jobs(): string {
    return this.upper() + "_JOBS";
  }
  jobsShard(i: number): string {
    return i === 0 ? this.jobs() : `${this.jobs()}_${i}`;
  }
  results(): string {
    return this.upper() + "_RESULTS";
  }
}

/** messageSize is what the Go client counts against max_payload. */
export function messageSize(subject: string, payload: Uint8Array, headers: Array<[string, string]>): number {
  let size = payload.length + byteLength(subject) + 64;
  for (const [k, v] of headers) {
    size += byteLength(k) + byteLength(v) + 4;
  }
  return size;
}

/** An outcome: the result, or the handler's error. */
export type Outcome = { ok: true; result: Uint8Array } | { ok: false; error: RemoteError };

/**
 * decodeKept reads a kept outcome (a results bucket value): one byte of
 * kind ('o' result, 'e' error, 'p' permanent, 'd' dead-lettered), then
 * the result or the error text. null: not an outcome.
 */
export function decodeKept(b: Uint8Array, jobId?: string): Outcome | null {
  if (b.length === 0) return null;
  const rest = b.subarray(1);
  switch (b[0]) {
    case 0x6f: // o
      return { ok: true, result: rest };
    case 0x65: // e
    case 0x70: // p
    case 0x64: // d
      return { ok: false, error: new RemoteError(Buffer.from(rest).toString("utf8"), b[0] !== 0x65, b[0] === 0x64, jobId) };
  }
  return null;
}

/**
 * decodeReply reads a single reply: any Keylane-Error or
 * Keylane-Error-Kind header makes it an error, even an empty one.
 */
export function decodeReply(get: (name: string) => string | undefined, data: Uint8Array, jobId?: string): Outcome {
  const err = get(Header.Error);
  const kind = get(Header.ErrorKind) ?? "";
  if (err !== undefined || kind !== "") {
    const text = err === undefined || err === "" ? "(no error text)" : err;
    return { ok: false, error: new RemoteError(text, kind === "permanent" || kind === "dead", kind === "dead", jobId) };
  }
  return { ok: true, result: data };
}

/** The namespace's settings a job message depends on. */
export interface NamespaceSettings {
  namespace: string;
  partitions: number;
  shards: number;
  replyPrefix: string;
}

/** What a caller asks for: one job. */
export interface JobInput {
  key: string;
  payload: Uint8Array;
  /** The job ID: the caller's (explicit) or a generated one. */
  id: string;
  /** The caller chose the ID (and may retry with it). */
  explicit: boolean;
  type?: string;
  /** The caller's own headers, each with one value or several. */
  headers?: Record<string, string | string[]>;
  /** A call's reply subject (its inbox and token). */
  reply?: string;
  /** A call: the worker keeps its outcome by ID. */
  call?: boolean;
  /** A delayed job's due time: a submission on its delay subject (delaySubject). */
  runAt?: Date;
}

/** A job message as it is published. */
export interface JobMessage {
  id: string;
  key: string;
  subject: string;
  payload: Uint8Array;
  headers: Array<[string, string]>;
  idempotent: boolean;
}

/**
 * buildJob checks every field of a job by the rule the worker applies on
 * receipt and builds its message, as the Go client's message (client.go)
 * and Call (call.go) do: the same subject, the same headers, the same
 * size limit (max_payload less DeadLetterReserve, counting headers).
 */
export function buildJob(ns: NamespaceSettings, input: JobInput, maxPayload: number): JobMessage {
  validateKey(input.key);
  const type = input.type ?? "";
  validateType(type);
  const user: Array<[string, string]> = [];
  for (const [k, vs] of Object.entries(input.headers ?? {})) {
    const list = Array.isArray(vs) ? vs : [vs];
    if (list.length === 0) validateUserHeader(k, "");
    for (const v of list) {
      validateUserHeader(k, v);
      user.push([k, v]);
    }
  }
  if (input.reply !== undefined && !validReply(input.reply, ns.replyPrefix)) {
    throw new KeylaneError("refused", `wire: reply subject is not a plain subject under the reply prefix ${JSON.stringify(ns.replyPrefix)} (got ${JSON.stringify(clip(input.reply))})`);
  }
  validateJobID(input.id);
  const p = partitionOf(input.key, ns.partitions);
  if (input.runAt !== undefined && input.reply !== undefined) {
    throw new KeylaneError("delayed_call", "keylane: call takes no delay: submit the delayed job with an id, and read its outcome with result(id)", input.id);
  }
  const subject = input.runAt !== undefined ? delaySubject(ns.namespace, p, input.id) : jobsSubject(ns.namespace, p, input.key);
  const headers: Array<[string, string]> = [...user];
  headers.push([Header.JobID, input.id], [Header.Key, input.key], [Header.Partitions, String(ns.partitions)]);
  // The subject decides the shard's stream; the server refuses the job
  // if it would land in any other.
  headers.push([Header.ExpectedStream, new Names(ns.namespace).jobsShard(shardOf(p, ns.shards))]);
  if (type !== "") headers.push([Header.Type, type]);
  if (input.reply !== undefined) headers.push([Header.Reply, input.reply]);
  if (input.runAt !== undefined) headers.push([Header.RunAt, formatRunAt(input.runAt)]);
  // The caller may retry with this ID: the worker keeps its outcome by ID.
  if (input.explicit) headers.push([Header.Idempotent, "1"]);
  const size = messageSize(subject, input.payload, headers);
  const max = maxPayload - DeadLetterReserve;
  if (size > max) {
    throw new KeylaneError("payload_too_large", `keylane: payload larger than the server's max_payload: ${size} bytes with headers, limit ${max} (max_payload less ${DeadLetterReserve} for a dead letter's headers)`, input.id);
  }
  // A call's outcome is kept by ID, so a reply lost with a connection is
  // recovered from it.
  if (input.call) headers.push([Header.KeepOutcome, "1"]);
  return { id: input.id, key: input.key, subject, payload: input.payload, headers, idempotent: input.explicit };
}

/**
 * markRetry makes m the copy published again after no stream ack: it
 * asks the worker to look its ID up before running it.
 */
export function markRetry(m: JobMessage): void {
  if (!m.idempotent) {
    m.headers.push([Header.Idempotent, "1"]);
    m.idempotent = true;
  }
}

/** A JetStream publish ack, as the server sends it. */
export interface StreamAck {
  stream?: string;
  seq?: number;
  duplicate?: boolean;
  error?: { code: number; err_code?: number; description?: string };
}

/** parseStreamAck reads a stream ack's JSON; unreadable JSON is an error ack. */
export function parseStreamAck(data: Uint8Array): StreamAck {
  const text = Buffer.from(data).toString("utf8");
  try {
    const a = JSON.parse(text) as StreamAck;
    if (a && typeof a === "object") return a;
  } catch {
    // below
  }
  return { error: { code: 500, description: `bad stream ack ${JSON.stringify(text)}` } };
}

/**
 * backlogFull: the server's refusal of a job over its key's cap
 * (MaxMsgsPerSubject with DiscardNewPerSubject): error 10077, "maximum
 * messages per subject exceeded". It comes with code 503 but is never
 * retried.
 */
export function backlogFull(e: NonNullable<StreamAck["error"]>): boolean {
  return e.err_code === 10077 && (e.description ?? "").includes("maximum messages per subject exceeded");
}

/**
 * transient: an ack error that publishing the same message again may
 * cure (classOf's "transient").
 */
export function transient(e: NonNullable<StreamAck["error"]>): boolean {
  return classOf({ error: e }) === "transient";
}

/** What a client makes of a stream ack (PROTOCOL.md § 7; replies.json's class). */
export type AckClass = "stored" | "duplicate" | "key_backlog_full" | "permanent" | "transient" | "limit";

// The server's err_codes by what they mean to a producer (PROTOCOL.md §
// 7; Go: internal/natserr). permanentCodes: no retry of the same message
// cures them (message too large, no stream, Nats-Expected-Stream
// mismatch, replicas, Nats-TTL, atomic batches, message schedules);
// transientCodes: the cluster placing or moving the stream, with a 4xx
// code.
const permanentCodes = new Set([10054, 10059, 10060, 10074, 10166, 10174, 10175, 10176, 10179, 10199, 10200, 10188, 10189, 10190, 10191, 10192, 10203]);
const transientCodes = new Set([10005, 10040, 10044, 10124, 10202, 10226]);

/**
 * classOf classifies a stream ack by its err_code, never by its code
 * alone (a key at its cap and a full stream share 503 and 10077 with an
 * election's code): the first row of PROTOCOL.md § 7's table that
 * matches. "transient": publish the same message again; "limit": the
 * stream (or the account's storage) is full, reported, not retried;
 * "key_backlog_full": the job's key is at its cap, never published
 * again; "permanent": reported. An err_code it does not know is read by
 * its code: 408 or 5xx transient, any other permanent.
 */
export function classOf(a: StreamAck): AckClass {
  const e = a.error;
  if (!e) return a.duplicate ? "duplicate" : "stored";
  const ec = e.err_code ?? 0;
  if (backlogFull(e)) return "key_backlog_full";
  if (permanentCodes.has(ec)) return "permanent";
  if (transientCodes.has(ec)) return "transient";
  if (ec === 10077 || ec === 10023) return "limit";
  if (ec === 10008 || e.code === 408 || e.code >= 500) return "transient";
  return "permanent";
}

/** validPartitionCount: a namespace's partition count is 1 to 4096. */
export function validPartitionCount(n: number): boolean {
  return Number.isInteger(n) && n >= 1 && n <= MaxPartitions;
}

/**
 * heldSubject is where a worker tells the call with reply subject reply
 * that its job is held: the reply's last token with "=" before it.
 */
export function heldSubject(reply: string): string {
  const dot = reply.lastIndexOf(".");
  if (dot < 0 || dot === reply.length - 1) return "";
  return reply.slice(0, dot + 1) + "=" + reply.slice(dot + 1);
}

// Batch outcome entries (package wire, outcomes.go): batched Calls have
// their outcomes kept per batch, in one results-bucket entry under
// batchOutcomesKey(batch ID), and their job IDs name the batch and the
// index (batchedJobID). result(id), and a call recovering its reply, read
// such a job's outcome from its batch's entry.

/** The most jobs a batch holds (wire.MaxBatchJobs). */
export const MaxBatchJobs = 1024;
/**
 * The most bytes a batch of several jobs, or a batch entry, holds
 * (wire.MaxBatchBytes). A batch of one is bounded by max_payload alone.
 */
export const MaxBatchBytes = 8 << 20;
/** A batch ID's length: a nuid's (wire.BatchIDLen). */
export const BatchIDLen = 22;
export const BatchOutcomesPrefix = "batch/";
const outcomesMagic = "KLO";
const OutcomesVersion = 1;

/** batchOutcomesKey is the results-bucket key of a batch's entry. */
export function batchOutcomesKey(batchID: string): string {
  return BatchOutcomesPrefix + batchID;
}

/** validBatchID: BatchIDLen ASCII letters and digits. */
export function validBatchID(id: string): boolean {
  return id.length === BatchIDLen && /^[A-Za-z0-9]+$/.test(id);
}

/**
 * parseBatchedJobID splits a batched Call's job ID (the batch ID, '.',
 * the index in shortest decimal below MaxBatchJobs); null for any other.
 */
export function parseBatchedJobID(id: string): { batchID: string; index: number } | null {
  const dot = id.lastIndexOf(".");
  if (dot <= 0) return null;
  const batchID = id.slice(0, dot);
  const digits = id.slice(dot + 1);
  if (!/^(0|[1-9][0-9]{0,3})$/.test(digits)) return null;
  const index = Number(digits);
  if (index >= MaxBatchJobs || !validBatchID(batchID)) return null;
  return { batchID, index };
}

/** A batch entry's outcome: the job's index, its ID and its kept outcome. */
export interface BatchOutcome {
  index: number;
  id: string;
  value: Uint8Array;
}

function badOutcomes(why: string): KeylaneError {
  return new KeylaneError("refused", "keylane: malformed batch outcomes entry: " + why);
}

/**
 * decodeBatchOutcomes reads a batch entry as wire.DecodeBatchOutcomes
 * does, refusing (KeylaneError "refused") what it refuses: a wrong magic
 * or version, over MaxBatchBytes, a count of 0 or over MaxBatchJobs,
 * indexes not strictly ascending, a job ID other than its batched one, an
 * empty outcome, a length past the end, a uvarint not in its shortest
 * form, bytes after the last outcome.
 */
export function decodeBatchOutcomes(b: Uint8Array): { batchID: string; outcomes: BatchOutcome[] } {
  if (b.length > MaxBatchBytes) throw badOutcomes(`${b.length} bytes, limit ${MaxBatchBytes}`);
  if (b.length < outcomesMagic.length + 1 || Buffer.from(b.subarray(0, outcomesMagic.length)).toString("latin1") !== outcomesMagic) {
    throw badOutcomes(`no "${outcomesMagic}" magic`);
  }
  if (b[outcomesMagic.length] !== OutcomesVersion) throw badOutcomes(`version ${b[outcomesMagic.length]}, this client reads ${OutcomesVersion}`);
  let i = outcomesMagic.length + 1;
  // uvarint reads a shortest-form uvarint of at most max.
  const uvarint = (what: string, max: number): number => {
    let n = 0;
    let shift = 1;
    for (let w = 0; ; w++) {
      if (i + w >= b.length || w >= 10) throw badOutcomes(`bad ${what} at byte ${i}`);
      const c = b[i + w];
      n += (c & 0x7f) * shift;
      shift *= 128;
      if (c < 0x80) {
        if ((w > 0 && c === 0) || n > max) throw badOutcomes(`bad ${what} at byte ${i}`);
        i += w + 1;
        return n;
      }
    }
  };
  const field = (what: string): Uint8Array => {
    const at = i;
    let n: number;
    try {
      n = uvarint("length of the " + what, MaxBatchBytes);
    } catch {
      throw badOutcomes(`bad length of the ${what} at byte ${at}`);
    }
    if (n > b.length - i) throw badOutcomes(`bad length of the ${what} at byte ${at}`);
    const f = b.subarray(i, i + n);
    i += n;
    return f;
  };
  const text = (f: Uint8Array) => Buffer.from(f).toString("latin1");
  const batchID = text(field("batch ID"));
  const n = uvarint("outcome count", MaxBatchJobs);
  if (n === 0) throw badOutcomes(`no outcome at byte ${i}`);
  const outcomes: BatchOutcome[] = [];
  for (let k = 0; k < n; k++) {
    const index = uvarint("index", MaxBatchJobs - 1);
    const id = text(field("job ID"));
    const value = field("outcome");
    outcomes.push({ index, id, value });
  }
  if (i !== b.length) throw badOutcomes(`bytes after the last outcome at byte ${i}`);
  if (!validBatchID(batchID)) throw badOutcomes(`batch ID ${JSON.stringify(batchID)} is not ${BatchIDLen} letters and digits`);
  outcomes.forEach((o, k) => {
    if (k > 0 && o.index <= outcomes[k - 1].index) throw badOutcomes(`index ${o.index} out of order or range`);
    if (o.id !== `${batchID}.${o.index}`) throw badOutcomes(`job ID ${JSON.stringify(o.id)} at index ${o.index} of batch ${JSON.stringify(batchID)}`);
    if (o.value.length === 0) throw badOutcomes(`empty outcome at index ${o.index}`);
  });
  return { batchID, outcomes };
}

/**
 * findBatchOutcome returns job id's kept outcome in b, the entry of batch
 * batchID, where id is at index: null when the entry holds none at the
 * index (the job's outcome may be kept by ID, or not yet). An entry that
 * does not decode, is another batch's, or holds another job at the index
 * throws (KeylaneError "refused"): never another job's outcome.
 */
export function findBatchOutcome(b: Uint8Array, batchID: string, index: number, id: string): Uint8Array | null {
  const e = decodeBatchOutcomes(b);
  if (e.batchID !== batchID) throw badOutcomes(`entry of batch ${JSON.stringify(e.batchID)} read for batch ${JSON.stringify(batchID)}`);
  for (const o of e.outcomes) {
    if (o.index !== index) continue;
    if (o.id !== id) throw badOutcomes(`job ${JSON.stringify(o.id)} at index ${index}, not ${JSON.stringify(id)}`);
    return o.value;
  }
  return null;
}

/** batchedJobID is the job ID of the job at index in batch batchID (wire.BatchedJobID). */
export function batchedJobID(batchID: string, index: number): string {
  return `${batchID}.${index}`;
}

// Batch messages (package wire, batch.go): the one message format a
// client sends (a lone job as a batch of one), many jobs of one partition
// in one stream message, their fields in the body:
//
//   "KLB" and the version byte (1)
//   uvarint   job count, 1 to MaxBatchJobs
//   per job:
//     uvarint length and bytes of the key, the job ID, the type, the reply
//     byte      flags: 1 keep-outcome, 2 idempotent; no other bit
//     uvarint   header count; per header, names strictly ascending (by
//               bytes): uvarint length and name, uvarint value count, per
//               value uvarint length and value
//     uvarint length and bytes of the payload
//
// Every uvarint in its shortest form: one body per batch of jobs.

/** The body format version this client writes (wire.BatchVersion). */
export const BatchVersion = 1;
/** A batch's last subject token in its partition (wire.BatchToken). */
export const BatchToken = "batch";
/** The bytes of a batch body before its jobs, at most (wire.BatchHeaderSize). */
export const BatchHeaderSize = 3 + 1 + 10;
const batchMagic = "KLB";
const batchKeepOutcome = 1;
const batchIdempotent = 2;

/** One job of a batch body, as sent (wire.BatchJob). */
export interface BatchJob {
  key: string;
  id: string;
  type: string;
  reply: string;
  /** The worker keeps the job's outcome (a call). */
  keepOutcome: boolean;
  /** The job carries its caller's ID: the worker looks it up before running it. */
  idempotent: boolean;
  /** The submitter's own headers: name → values. */
  headers: Record<string, string[]>;
  payload: Uint8Array;
}

/** batchSubject is where partition p's batches go: <ns>.jobs.<p>.batch. */
export function batchSubject(namespace: string, p: number): string {
  return `${namespace}.jobs.${p}.${BatchToken}`;
}

function uvarintSize(n: number): number {
  let w = 1;
  while (n >= 0x80) {
    n = Math.floor(n / 128);
    w++;
  }
  return w;
}

function fieldSize(n: number): number {
  return uvarintSize(n) + n;
}

// sortedNames returns h's header names in Go's string order (by bytes).
function sortedNames(h: Record<string, string[]>): string[] {
  return Object.keys(h).sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));
}

/** batchJobSize is the bytes j adds to a batch body (wire.BatchJobSize). */
export function batchJobSize(j: BatchJob): number {
  let n = fieldSize(byteLength(j.key)) + fieldSize(byteLength(j.id)) + fieldSize(byteLength(j.type)) + fieldSize(byteLength(j.reply)) + 1;
  const names = Object.keys(j.headers);
  n += uvarintSize(names.length) + fieldSize(j.payload.length);
  for (const name of names) {
    const vs = j.headers[name];
    n += fieldSize(byteLength(name)) + uvarintSize(vs.length);
    for (const v of vs) n += fieldSize(byteLength(v));
  }
  return n;
}

/**
 * encodeBatch returns the body of a batch of jobs, byte for byte what
 * wire.EncodeBatch writes. It checks only the batch's limits (1 to
 * MaxBatchJobs jobs, several of them in at most MaxBatchBytes; a batch of
 * one is bounded by max_payload alone): each job's fields are
 * checked where it is built (buildBatchJob).
 */
export function encodeBatch(jobs: BatchJob[]): Uint8Array {
  if (jobs.length === 0 || jobs.length > MaxBatchJobs) {
    throw new KeylaneError("payload_too_large", `wire: a batch holds 1 to ${MaxBatchJobs} jobs in at most 8 MiB (got ${jobs.length} jobs)`);
  }
  let size = batchMagic.length + 1 + uvarintSize(jobs.length);
  for (const j of jobs) size += batchJobSize(j);
  if (size > MaxBatchBytes && jobs.length > 1) {
    throw new KeylaneError("payload_too_large", `wire: a batch holds 1 to ${MaxBatchJobs} jobs, several of them in at most 8 MiB (got ${size} bytes in ${jobs.length} jobs)`);
  }
  const b = new Uint8Array(size);
  let i = 0;
  const uvarint = (n: number) => {
    while (n >= 0x80) {
      b[i++] = (n % 128) | 0x80;
      n = Math.floor(n / 128);
    }
    b[i++] = n;
  };
  const bytes = (f: Uint8Array) => {
    uvarint(f.length);
    b.set(f, i);
    i += f.length;
  };
  const text = (s: string) => bytes(utf8(s));
  b.set(utf8(batchMagic), 0); // the magic goes bare, without a length
  i = batchMagic.length;
  b[i++] = BatchVersion;
  uvarint(jobs.length);
  for (const j of jobs) {
    text(j.key);
    text(j.id);
    text(j.type);
    text(j.reply);
    b[i++] = (j.keepOutcome ? batchKeepOutcome : 0) | (j.idempotent ? batchIdempotent : 0);
    const names = sortedNames(j.headers);
    uvarint(names.length);
    for (const name of names) {
      text(name);
      const vs = j.headers[name];
      uvarint(vs.length);
      for (const v of vs) text(v);
    }
    bytes(j.payload);
  }
  if (i !== size) throw new Error(`keylane: batch body of ${i} bytes, sized ${size}`);
  return b;
}

/**
 * decodeBatch reads a batch body as wire.DecodeBatch does, refusing
 * (KeylaneError "refused") what it refuses: a wrong magic or version, a
 * job count of 0 or over MaxBatchJobs, a body of several jobs over
 * MaxBatchBytes (a batch of one is bounded by max_payload alone), a
 * length past the end, a uvarint not in its shortest form, an unknown
 * flag, header names not strictly ascending, bytes after the last job.
 * This client never needs it to send; it is for tools and tests.
 */
export function decodeBatch(b: Uint8Array): BatchJob[] {
  const bad = (why: string) => new KeylaneError("refused", "wire: malformed batch: " + why);
  if (b.length < batchMagic.length + 1 || Buffer.from(b.subarray(0, 3)).toString("latin1") !== batchMagic) throw bad(`no "${batchMagic}" magic`);
  if (b[3] !== BatchVersion) throw bad(`version ${b[3]}, this client reads ${BatchVersion}`);
  let i = 4;
  const uvarint = (what: string, max: number): number => {
    let n = 0;
    let shift = 1;
    for (let w = 0; ; w++) {
      if (i + w >= b.length || w >= 10) throw bad(`bad ${what} at byte ${i}`);
      const c = b[i + w];
      n += (c & 0x7f) * shift;
      shift *= 128;
      if (c < 0x80) {
        if ((w > 0 && c === 0) || n > max) throw bad(`bad ${what} at byte ${i}`);
        i += w + 1;
        return n;
      }
    }
  };
  const field = (what: string): Uint8Array => {
    const n = uvarint("length of the " + what, b.length);
    if (n > b.length - i) throw bad(`bad length of the ${what} at byte ${i}`);
    const f = b.subarray(i, i + n);
    i += n;
    return f;
  };
  const text = (what: string) => Buffer.from(field(what)).toString("utf8");
  const n = uvarint("job count", MaxBatchJobs);
  if (n === 0) throw bad("no jobs");
  if (n > 1 && b.length > MaxBatchBytes) throw bad(`${b.length} bytes in ${n} jobs, limit ${MaxBatchBytes} for a batch of several`);
  const jobs: BatchJob[] = [];
  for (let k = 0; k < n; k++) {
    const key = text("key");
    const id = text("job ID");
    const type = text("type");
    const reply = text("reply");
    if (i >= b.length) throw bad("flags past the end");
    const flags = b[i++];
    if (flags & ~(batchKeepOutcome | batchIdempotent)) throw bad("unknown flags");
    const headers: Record<string, string[]> = {};
    const nh = uvarint("header count", b.length);
    let prev: Uint8Array | null = null;
    for (let h = 0; h < nh; h++) {
      const name = field("header name");
      if (prev && Buffer.compare(name, prev) <= 0) throw bad("header names not strictly ascending");
      prev = name;
      const nv = uvarint("header value count", b.length);
      const vs: string[] = [];
      for (let v = 0; v < nv; v++) vs.push(text("header value"));
      headers[Buffer.from(name).toString("utf8")] = vs;
    }
    const payload = field("payload");
    jobs.push({ key, id, type, reply, keepOutcome: (flags & batchKeepOutcome) !== 0, idempotent: (flags & batchIdempotent) !== 0, headers, payload });
  }
  if (i !== b.length) throw bad("bytes after the last job");
  return jobs;
}

/** A batch message as it is published. */
export interface BatchMessage {
  /** The batch ID (its Nats-Msg-Id). */
  id: string;
  partition: number;
  subject: string;
  headers: Array<[string, string]>;
  body: Uint8Array;
}

/**
 * batchJobOf is input as a job of a batch: the fields buildJob checked,
 * the caller's own headers (a name given no value is sent with none, as
 * in a one-job message), keep-outcome for a call, idempotent for a
 * caller's ID.
 */
export function batchJobOf(input: JobInput): BatchJob {
  const headers: Record<string, string[]> = {};
  for (const [k, vs] of Object.entries(input.headers ?? {})) {
    const list = Array.isArray(vs) ? vs : [vs];
    if (list.length > 0) headers[k] = [...list];
  }
  return {
    key: input.key,
    id: input.id,
    type: input.type ?? "",
    reply: input.reply ?? "",
    keepOutcome: Boolean(input.call),
    idempotent: input.explicit,
    headers,
    payload: input.payload,
  };
}

/** Where a batch goes when it is not on its partition's batch subject. */
export interface BatchOptions {
  /**
   * A delayed job's submission (PROTOCOL.md § 13): the batch carries one
   * job, goes on its ID's delay subject and carries Keylane-Run-At.
   */
  runAt?: Date;
  /**
   * A namespace with a key backlog cap (§ 2, § 12): the batch carries one
   * job and goes on its key's subject, where the server counts it against
   * the cap.
   */
  keySubject?: boolean;
}

/**
 * buildBatch is the batch message of jobs, all of partition p, under
 * batch ID batchID (22 random letters and digits): on <ns>.jobs.<p>.batch
 * with Nats-Msg-Id (the batch ID), Nats-Expected-Stream (the partition's
 * shard), Keylane-Batch, Keylane-Batch-Jobs and Keylane-Partitions, the
 * body encodeBatch's. A job without its caller's ID must carry
 * batchedJobID(batchID, index): the worker refuses any other. A batch of
 * one may go elsewhere (opts, as the Go client's batchMessage): a delayed
 * job's on its ID's delay subject with Keylane-Run-At, and on a namespace
 * with a key backlog cap on its job's key's subject.
 */
export function buildBatch(ns: NamespaceSettings, p: number, batchID: string, jobs: BatchJob[], opts: BatchOptions = {}): BatchMessage {
  if (!validBatchID(batchID)) throw new KeylaneError("bad_job_id", `keylane: batch ID ${JSON.stringify(clip(batchID))} is not ${BatchIDLen} letters and digits`);
  jobs.forEach((j, k) => {
    if (partitionOf(j.key, ns.partitions) !== p) throw new KeylaneError("bad_key", `keylane: key ${JSON.stringify(clip(j.key))} is not of partition ${p}`);
    if (!j.idempotent && j.id !== batchedJobID(batchID, k)) {
      throw new KeylaneError("bad_job_id", `keylane: job ${k} of batch ${batchID} has ID ${JSON.stringify(clip(j.id))}, not its batch's and index's`);
    }
  });
  let subject = batchSubject(ns.namespace, p);
  if (opts.runAt !== undefined || opts.keySubject) {
    if (jobs.length !== 1) {
      throw new KeylaneError("refused", `keylane: ${jobs.length} jobs in one batch ${opts.runAt !== undefined ? "of a delayed job (a delayed job goes alone)" : "on a namespace with a key backlog cap (a batch there carries one job)"}`);
    }
    subject = opts.runAt !== undefined ? delaySubject(ns.namespace, p, jobs[0].id) : jobsSubject(ns.namespace, p, jobs[0].key);
  }
  const body = encodeBatch(jobs);
  const headers: Array<[string, string]> = [
    [Header.JobID, batchID],
    [Header.ExpectedStream, new Names(ns.namespace).jobsShard(shardOf(p, ns.shards))],
    [Header.Batch, String(BatchVersion)],
    [Header.BatchJobs, String(jobs.length)],
    [Header.Partitions, String(ns.partitions)],
  ];
  if (opts.runAt !== undefined) headers.push([Header.RunAt, formatRunAt(opts.runAt)]);
  return { id: batchID, partition: p, subject, headers, body };
}
