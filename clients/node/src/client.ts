// The keylane client for Node.js: submit and call jobs of a namespace whose
// workers run keylane (Go). It speaks the same wire protocol as the Go
// client (submit.go, call.go, client.go, wirebatch.go): every job in a
// batch message (a lone job as a batch of one; on a namespace with a key
// backlog cap a batch of one on its key's subject; a delayed job's a
// batch of one on its ID's delay subject); the same checks before
// anything is sent, the same retries, the same classification of stream
// acks (classOf), and every wait bounded by a timeout.

import { randomBytes } from "node:crypto";
import { connect as natsConnect, type NodeConnectionOptions } from "@nats-io/transport-node";
import { headers as natsHeaders, nuid, type Msg, type MsgHdrs, type NatsConnection, type Subscription } from "@nats-io/nats-core";
import { jetstream, jetstreamManager, type StreamInfo } from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import { AbortedError, HeldError, KeyBacklogFullError, KeylaneError, NoReplyError } from "./errors.js";
import { jetStreamErrCode, publishRefusal } from "./natserrors.js";
import {
  DefaultNamespace,
  DefaultReplyPrefix,
  HashName,
  Header,
  MaxPartitions,
  MaxStreamShards,
  Meta,
  Names,
  SubjectsVersion,
  OneJobVersion,
  decodeKept,
  batchOutcomesKey,
  findBatchOutcome,
  parseBatchedJobID,
  batchJobOf,
  batchedJobID,
  buildBatch,
  buildJob,
  BatchHeaderSize,
  batchJobSize,
  DeadLetterReserve,
  MaxBatchBytes,
  messageSize,
  runAtDecision,
  partitionOf,
  type BatchJob,
  type BatchMessage,
  parseStreamAck,
  classOf,
  decodeBatch,
  type StreamAck,
  decodeReply,
  markRetry,
  validateJobID,
  type JobMessage,
  utf8,
  type Outcome,
} from "./wire.js";

// newJobID is a generated job ID: 22 letters and digits from the
// platform's CSPRNG, unguessable (a nuid is a fixed prefix and a counter
// with a fixed step: another client that saw some could work out the
// next and store messages under them first). As the Go client's
// (randid.go).
const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
function newJobID(): string {
  let id = "";
  while (id.length < 22) {
    for (const b of randomBytes(32)) {
      if (b < 248 && id.length < 22) id += idAlphabet[b % 62];
    }
  }
  return id;
}

/** Options of Client.open (and connect). */
export interface OpenOptions {
  /** The namespace. Defaults to "keylane". */
  namespace?: string;
  /** When set, must equal the namespace's partition count (else partition_mismatch). */
  partitions?: number;
  /** When set, must equal the namespace's jobs stream shard count (else shards_mismatch). */
  shards?: number;
  /** Bound of each request to the server while opening, in ms. Defaults to 5000. */
  requestTimeout?: number;
}

/** Options of connect: where the server is, and the namespace. */
export interface ConnectOptions extends OpenOptions {
  /** Server URL(s). Defaults to "127.0.0.1:4222". */
  servers?: string | string[];
  /** Further options for the NATS connection (credentials, TLS, ...). */
  nats?: NodeConnectionOptions;
}

/** Options of one submit or call. */
export interface JobOptions {
  /**
   * The job ID, the idempotency key: submitting or calling again with the
   * same ID never runs the job twice (see README.md, "Retries"). Defaults
   * to a new unique ID.
   */
  id?: string;
  /** The job type (routes the job in a Go Mux). Optional. */
  type?: string;
  /** Extra headers carried to the handler (not Nats-*, Keylane-*, Status or Description). */
  headers?: Record<string, string | string[]>;
  /** How long to wait in all, in ms. Defaults to 30000. */
  timeout?: number;
  /**
   * Aborts the submit or call (AbortedError, name "AbortError"): before
   * anything is sent, nothing is stored; after, whether the job was
   * stored is unknown, as after a timeout (try again with the same id).
   */
  signal?: AbortSignal;
  /**
   * submit only: the job joins its key's queue this many ms from now
   * (0 to 30 days; 0 is now). The namespace must take delayed jobs
   * (keylane.delays), else delays_off. call refuses it (delayed_call).
   */
  delay?: number;
  /**
   * submit only: the job joins its key's queue at this time, never
   * before and once (at most 30 days ahead; up to a second in the past
   * runs at once, further is bad_delay). Give it an id to read its
   * outcome later with result(id).
   */
  runAt?: Date;
}

/** One job of submitMany: its key and payload, and a submit's options but timeout and signal. */
export interface ManyJob extends Omit<JobOptions, "timeout" | "signal"> {
  key: string;
  payload?: Uint8Array | string;
}

/** submitMany's answer for one job: its ID, and error unless the stream stored it. */
export interface Submitted {
  id: string;
  error?: KeylaneError;
}

/** What the namespace's jobs stream metadata says (Go's Meta, the parts a client uses). */
export interface NamespaceInfo {
  namespace: string;
  partitions: number;
  shards: number;
  replyPrefix: string;
  /** The per-key backlog cap, or 0 for none. */
  maxKeyBacklog: number;
  /**
   * The namespace says keylane.batches on (metadata of an earlier
   * keylane, which had a switch for batch messages). Every worker of this
   * release reads batch messages, and this client sends them whatever it
   * says.
   */
  batches: boolean;
  /** The namespace takes delayed jobs (keylane.delays "2"): submit's delay and runAt. */
  delays: boolean;
}

// How long a job waits for the stream's ack before it is published again,
// doubling up to the maximum (call.go: callAckWait, maxCallAckWait).
const ackWaitFirst = 1000;
const ackWaitMax = 2000;
// How long a call waits for the reply of a stored job before it also
// reads the results bucket for the kept outcome (call.go: replyWait).
const replyWait = 5000;
// How often the kept outcome is read while waiting for it.
const outcomePoll = 500;
// How soon a job is published again after the stream said it has no
// leader or could not store it right now (call.go: noLeaderPause).
const noLeaderPause = 250;
const defaultTimeout = 30000;
const defaultRequestTimeout = 5000;

// submitMany cuts a partition's jobs into batches of at most this many
// (the Go client's wireBatchMaxJobs; the wire takes 1024), and has at
// most manyMaxPending messages awaiting their acks at once.
const manyBatchMaxJobs = 256;
const manyMaxPending = 256;

const ackMark = "_"; // an ack's token: ackMark and the job's token
const heldMark = "="; // a held notice's token: heldMark and the job's token

type Event =
  | { t: "ack"; m: Msg; copy?: number }
  | { t: "result"; m: Msg }
  | { t: "held"; m: Msg }
  | { t: "reconnect" }
  | { t: "refused"; subject: string; error: Error }
  | { t: "closed" }
  | { t: "aborted" };

// Waiter receives one job's acks, its reply, a held notice and the
// connection's news, in order; next waits for the next one, bounded.
class Waiter {
  private q: Event[] = [];
  private wake: (() => void) | null = null;
  private acks = 0;

  push(e: Event): void {
    if (e.t === "ack") {
      // Copies published again bring more acks: a few are plenty.
      if (this.acks >= 8) return;
      this.acks++;
    }
    this.q.push(e);
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  async next(until: number): Promise<Event | null> {
    for (;;) {
      const e = this.q.shift();
      if (e) {
        if (e.t === "ack") this.acks--;
        return e;
      }
      const ms = until - Date.now();
      if (ms <= 0) return null;
      await new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          this.wake = null;
          resolve();
        }, ms);
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
    }
  }
}

// ackOf reads a stream ack: a 503 status (no responders: no stream, or no
// leader), or the server's JSON.
function ackOf(m: Msg): { noResponders: true } | { noResponders: false; ack: StreamAck } {
  if (m.data.length === 0 && m.headers?.code === 503) {
    return { noResponders: true };
  }
  return { noResponders: false, ack: parseStreamAck(m.data) };
}

function getter(h: MsgHdrs | undefined): (name: string) => string | undefined {
  return (name) => (h && h.has(name) ? h.get(name) : undefined);
}

function toBytes(payload: Uint8Array | string | undefined): Uint8Array {
  if (payload === undefined) return new Uint8Array(0);
  return typeof payload === "string" ? utf8(payload) : payload;
}

// hex64 reports whether s is a hexadecimal number (either case, no
// sign or prefix) below 2^64, as Go's strconv.ParseUint(s, 16, 64) reads.
function hex64(s: string): boolean {
  return /^[0-9a-fA-F]+$/.test(s) && BigInt("0x" + s) < 1n << 64n;
}

// readMeta checks one jobs stream's metadata as the Go client's readMeta
// does, and returns what it says.
function readMeta(info: StreamInfo, namespace: string): NamespaceInfo & { shard: number } {
  const sc = info.config;
  const md = sc.metadata ?? {};
  const name = sc.name;
  // "a-b" and "a_b" name the same objects: a stream under this
  // namespace's name on another's subjects is not this namespace's (Go:
  // foreignJobsStream).
  const foreign = (sc.subjects ?? []).find((s) => !s.startsWith(namespace + "."));
  if (foreign !== undefined) {
    throw new KeylaneError("no_topology", `keylane: namespace ${namespace} is not set up: the stream named for its jobs, ${name}, takes subject ${foreign}, another namespace's (names that differ only in '-' and '_' share object names); use another namespace name`);
  }
  const nText = md[Meta.Partitions] ?? "";
  const n = /^[0-9]+$/.test(nText) ? Number(nText) : NaN;
  if (!(n >= 1 && n <= MaxPartitions)) {
    throw new KeylaneError("partition_mismatch", `keylane: stream ${name} has no valid ${Meta.Partitions} metadata (${JSON.stringify(nText)})`);
  }
  if (md[Meta.Hash] !== HashName) {
    throw new KeylaneError("partition_mismatch", `keylane: stream ${name} uses hash ${JSON.stringify(md[Meta.Hash] ?? "")}, this client uses ${JSON.stringify(HashName)}`);
  }
  if (md[Meta.Version] === OneJobVersion) {
    throw new KeylaneError("old_jobs_stream", `keylane: stream ${name} has ${Meta.Version} "3": made by a keylane whose clients store one-job messages, which today's workers refuse unrun; drain it with the keylane that made it (its workers running, no client sending), then delete it (nats stream rm ${name}), or use another namespace`);
  }
  if (md[Meta.Version] !== SubjectsVersion) {
    throw new KeylaneError("old_jobs_stream", `keylane: stream ${name} has ${Meta.Version} ${JSON.stringify(md[Meta.Version] ?? "")}: made by an older keylane; drain it with the keylane that made it, or use another namespace`);
  }
  if (sc.allow_msg_schedules || sc.allow_rollup_hdrs) {
    throw new KeylaneError("old_jobs_stream", `keylane: stream ${name} allows message schedules or roll-ups (an earlier keylane's delayed jobs); drain it with the keylane that made it, or use another namespace`);
  }
  let shards = 1;
  let shard = 0;
  if (md[Meta.Shards] !== undefined) {
    const s = /^[0-9]+$/.test(md[Meta.Shards]) ? Number(md[Meta.Shards]) : NaN;
    const i = /^[0-9]+$/.test(md[Meta.Shard] ?? "") ? Number(md[Meta.Shard]) : NaN;
    if (!(s >= 1 && s <= Math.min(n, MaxStreamShards) && i >= 0 && i < s)) {
      throw new KeylaneError("shards_mismatch", `keylane: stream ${name} has bad shard metadata (${Meta.Shards} ${JSON.stringify(md[Meta.Shards])}, ${Meta.Shard} ${JSON.stringify(md[Meta.Shard] ?? "")})`);
    }
    shards = s;
    shard = i;
  }
  // Workers' keys, not used here, but a malformed value is refused as
  // the Go client's readMeta refuses it (PROTOCOL.md § 2, checks h-j).
  const maxDeliver = md[Meta.MaxDeliver];
  if (maxDeliver !== undefined && !(/^[0-9]+$/.test(maxDeliver) && Number(maxDeliver) >= 1)) {
    throw new KeylaneError("max_deliver_mismatch", `keylane: stream ${name} has a bad ${Meta.MaxDeliver} ${JSON.stringify(maxDeliver)}`);
  }
  const epoch = md[Meta.Epoch];
  if (epoch !== undefined && !(hex64(epoch) && BigInt("0x" + epoch) !== 0n)) {
    throw new KeylaneError("partition_mismatch", `keylane: stream ${name} has a bad ${Meta.Epoch} ${JSON.stringify(epoch)}`);
  }
  for (const a of (md[Meta.Adopted] ?? "").split(",")) {
    if (a !== "" && !hex64(a)) {
      throw new KeylaneError("partition_mismatch", `keylane: stream ${name} has a bad ${Meta.Adopted} ${JSON.stringify(a)}`);
    }
  }
  const b = md[Meta.Batches] ?? "";
  if (b !== "" && b !== "on" && b !== "off") {
    throw new KeylaneError("batches_mismatch", `keylane: stream ${name} has a bad ${Meta.Batches} ${JSON.stringify(b)} (on or off)`);
  }
  return {
    namespace,
    partitions: n,
    shards,
    shard,
    replyPrefix: md[Meta.ReplyPrefix] || DefaultReplyPrefix,
    maxKeyBacklog: sc.discard_new_per_subject && sc.max_msgs_per_subject > 0 ? sc.max_msgs_per_subject : 0,
    batches: b === "on",
    delays: md[Meta.Delays] === "2",
  };
}

/** Client submits jobs to one namespace. It is safe to use from many async tasks at once. */
export class Client {
  readonly nc: NatsConnection;
  readonly info: NamespaceInfo;
  private readonly names: Names;
  private readonly ownsConnection: boolean;
  private readonly requestTimeout: number;
  private readonly inbox: string;
  private sub: Subscription | null = null;
  private readonly waiters = new Map<string, Waiter>();
  private counter = 0;
  private closed = false;
  private kv: KV | null = null;
  // Tests only: where batch IDs come from, and how many of the next batch
  // publishes have their stream ack sent astray (lost).
  private batchIDs: () => string = newJobID;
  private lostAcks = 0;

  private constructor(nc: NatsConnection, info: NamespaceInfo, owns: boolean, requestTimeout: number) {
    this.nc = nc;
    this.info = info;
    this.names = new Names(info.namespace);
    this.ownsConnection = owns;
    this.requestTimeout = requestTimeout;
    this.inbox = info.replyPrefix + nuid.next() + ".";
    this.watchStatus();
  }

  /**
   * open reads the namespace's settings from its jobs streams' metadata
   * (partition count and hash, shards, reply prefix, batches, per-key
   * cap) on a connection that stays the caller's. A namespace that is not
   * set up is refused with no_topology.
   */
  static async open(nc: NatsConnection, opts: OpenOptions = {}): Promise<Client> {
    return Client.openOn(nc, opts, false);
  }

  private static async openOn(nc: NatsConnection, opts: OpenOptions, owns: boolean): Promise<Client> {
    const namespace = opts.namespace || DefaultNamespace;
    if (!/^[a-z][a-z0-9_-]{0,31}$/.test(namespace)) {
      // Go's namespace rule: an upper-case or dotted name would route
      // on subjects no jobs stream takes, or name another's objects.
      throw new KeylaneError("bad_namespace", `keylane: namespace ${JSON.stringify(namespace)} must match ^[a-z][a-z0-9_-]{0,31}$`);
    }
    const requestTimeout = opts.requestTimeout ?? defaultRequestTimeout;
    const names = new Names(namespace);
    const jsm = await jetstreamManager(nc, { timeout: requestTimeout, checkAPI: false });
    const streamInfo = async (name: string, what: string): Promise<StreamInfo> => {
      try {
        return await jsm.streams.info(name);
      } catch (err) {
        if (jetStreamErrCode(err) === 10059) {
          throw new KeylaneError("no_topology", `keylane: no jobs stream for namespace ${JSON.stringify(namespace)}${what}: start a keylane worker for it, which creates it (worker --namespace ${namespace})`, undefined, { cause: err });
        }
        throw err;
      }
    };
    const m0 = readMeta(await streamInfo(names.jobs(), ""), namespace);
    if (m0.shard !== 0) {
      throw new KeylaneError("shards_mismatch", `keylane: stream ${names.jobs()} says shard ${m0.shard} of ${m0.shards}, expected shard 0`);
    }
    if (opts.partitions !== undefined && opts.partitions !== 0 && opts.partitions !== m0.partitions) {
      throw new KeylaneError("partition_mismatch", `keylane: stream ${names.jobs()} has ${m0.partitions} partitions, configured ${opts.partitions}`);
    }
    if (opts.shards !== undefined && opts.shards !== 0 && opts.shards !== m0.shards) {
      throw new KeylaneError("shards_mismatch", `keylane: namespace ${namespace} has ${m0.shards} jobs stream shards, configured ${opts.shards}`);
    }
    for (let i = 1; i < m0.shards; i++) {
      const name = names.jobsShard(i);
      const m = readMeta(await streamInfo(name, ` (shard ${i} of ${m0.shards}, ${name}, is missing)`), namespace);
      if (m.partitions !== m0.partitions) {
        throw new KeylaneError("partition_mismatch", `keylane: stream ${name} has ${m.partitions} partitions, shard 0 ${m0.partitions}`);
      }
      if (m.shards !== m0.shards || m.shard !== i || m.replyPrefix !== m0.replyPrefix) {
        throw new KeylaneError("shards_mismatch", `keylane: stream ${name} says shard ${m.shard} of ${m.shards}, expected shard ${i} of ${m0.shards}`);
      }
    }
    const { shard: _shard, ...info } = m0;
    return new Client(nc, info, owns, requestTimeout);
  }

  /** connect opens a NATS connection and the namespace; close() closes both. */
  static async connect(opts: ConnectOptions = {}): Promise<Client> {
    const nc = await natsConnect({ servers: opts.servers ?? "127.0.0.1:4222", maxReconnectAttempts: -1, ...(opts.nats ?? {}) });
    try {
      return await Client.openOn(nc, opts, true);
    } catch (err) {
      await nc.close();
      throw err;
    }
  }

  /** The namespace's partition count. */
  get partitions(): number {
    return this.info.partitions;
  }

  /**
   * submit stores a job and resolves to its ID once JetStream has stored
   * it; it does not wait for the job to run. Bad input is refused before
   * anything is sent. The job travels as a batch message of one; a
   * generated ID is "<batch ID>.0". A job with an id that ran before is
   * stored again and answered by the worker from its kept outcome
   * without running (submit resolves); only on a namespace with a key
   * backlog cap, where the batch goes on its key's subject, is one
   * refused at the cap whose ID is still queued or was applied answered
   * duplicate (nothing new stored), and key_backlog_full only when it is
   * neither. A delayed job (delay or runAt) goes as a batch of one on its
   * ID's delay subject, with Keylane-Run-At. opts.signal aborts it
   * (AbortedError).
   */
  async submit(key: string, payload?: Uint8Array | string, opts: JobOptions = {}): Promise<string> {
    notAborted(opts.signal, "submit", opts.id);
    const deadline = Date.now() + (opts.timeout ?? defaultTimeout);
    const { job, batch } = this.message(key, toBytes(payload), opts, false);
    await this.submitBatch(batch, job.id, job.id, deadline, opts.signal, capJob(job, batch));
    return job.id;
  }

  /**
   * submitMany stores many jobs at once and resolves, once every one is
   * stored or refused, to one entry per job in the order given: its ID,
   * and error when it was not stored (or whether it was is unknown). It
   * never rejects for a job's sake. The jobs of a partition given in a
   * row travel in batch messages (the format of every job, PROTOCOL.md §
   * 12) of at most 256 jobs and the server's max_payload; a generated ID
   * is "<batch ID>.<index>", a caller's id stays. A job that goes alone
   * (a delayed job, any job on a namespace with a key backlog cap, one
   * too large for any batch of several: a batch of one, as submit sends
   * it) goes after its partition's batch before it, so a
   * key's jobs are stored in the order given. A batch the server refuses
   * refuses each of its jobs.
   * opts.timeout bounds the whole; opts.signal aborts what is not stored
   * yet (AbortedError: sent false for what was never published).
   */
  async submitMany(jobs: ManyJob[], opts: { timeout?: number; signal?: AbortSignal } = {}): Promise<Submitted[]> {
    const out: Submitted[] = jobs.map((j) => ({ id: j?.id ?? "" }));
    const signal = opts.signal;
    if (signal?.aborted) {
      out.forEach((o) => (o.error = new AbortedError("submit", o.id || undefined, false, signal.reason)));
      return out;
    }
    const deadline = Date.now() + (opts.timeout ?? defaultTimeout);
    const room = this.batchRoom();
    type Open = { batchID: string; jobs: BatchJob[]; idx: number[]; bytes: number; ids: Set<string> };
    const open = new Map<number, Open>();
    // Every message in the order it is published: a batch when cut, a
    // job that goes alone when met.
    const sends: Array<{ idx: number[]; run: () => Promise<void> }> = [];
    const flush = (p: number) => {
      const b = open.get(p);
      if (!b) return;
      open.delete(p);
      const msg = buildBatch(this.info, p, b.batchID, b.jobs);
      const label = `batch ${b.batchID} (${b.jobs.length} job${b.jobs.length === 1 ? "" : "s"})`;
      sends.push({
        idx: b.idx,
        run: async () => {
          try {
            await this.submitBatch(msg, label, undefined, deadline, signal);
          } catch (err) {
            for (const i of b.idx) out[i].error = errorOfJob(err, out[i].id);
          }
        },
      });
    };
    for (let i = 0; i < jobs.length; i++) {
      const j = jobs[i];
      let built: ReturnType<Client["message"]>;
      try {
        if (typeof j !== "object" || j === null) throw new KeylaneError("bad_key", `keylane: submitMany: job ${i} is not an object`);
        built = this.message(j.key, toBytes(j.payload), j, false);
      } catch (err) {
        out[i].error = errorOfJob(err, out[i].id);
        continue;
      }
      const { job, batch, bj, alone } = built;
      const p = partitionOf(job.key, this.info.partitions);
      if (alone) {
        flush(p); // a key's earlier jobs are stored first
        out[i].id = job.id;
        sends.push({
          idx: [i],
          run: async () => {
            try {
              await this.submitBatch(batch, job.id, job.id, deadline, signal, capJob(job, batch));
            } catch (err) {
              out[i].error = errorOfJob(err, job.id);
            }
          },
        });
        continue;
      }
      let b = open.get(p);
      const size = (o: Open) => batchJobSize({ ...bj, id: bj.idempotent ? bj.id : batchedJobID(o.batchID, o.jobs.length) });
      if (b && (b.jobs.length >= manyBatchMaxJobs || b.bytes + size(b) > room || (bj.idempotent && b.ids.has(bj.id)))) {
        // Full, or the caller's ID twice (the worker would refuse the
        // second copy in one batch): the next batch.
        flush(p);
        b = undefined;
      }
      if (!b) {
        b = { batchID: this.batchIDs(), jobs: [], idx: [], bytes: 0, ids: new Set() };
        open.set(p, b);
      }
      const id = bj.idempotent ? bj.id : batchedJobID(b.batchID, b.jobs.length);
      b.bytes += size(b);
      b.jobs.push({ ...bj, id });
      b.idx.push(i);
      b.ids.add(id);
      out[i].id = id;
    }
    for (const p of [...open.keys()]) flush(p);
    // Published in order, at most manyMaxPending messages awaiting their
    // acks at once.
    const running = new Set<Promise<void>>();
    for (const s of sends) {
      while (running.size >= manyMaxPending) await Promise.race(running);
      if (signal?.aborted) {
        for (const i of s.idx) out[i].error = new AbortedError("submit", out[i].id, false, signal.reason);
        continue;
      }
      const r: Promise<void> = s.run().finally(() => running.delete(r));
      running.add(r);
    }
    await Promise.all(running);
    return out;
  }


  /**
   * call stores a job and resolves to its handler's result. A handler
   * error rejects with a RemoteError; no outcome before the timeout with
   * a NoReplyError (call again with the same id: the job never runs
   * twice, and its outcome comes from where the worker keeps it).
   * opts.signal stops the wait (AbortedError); a call takes no delay
   * (delayed_call).
   */
  async call(key: string, payload?: Uint8Array | string, opts: JobOptions = {}): Promise<Uint8Array> {
    notAborted(opts.signal, "call", opts.id);
    if ((opts.delay !== undefined && opts.delay !== 0) || opts.runAt !== undefined) {
      throw new KeylaneError("delayed_call", "keylane: call takes no delay: submit the delayed job with an id, and read its outcome with result(id)", opts.id);
    }
    const deadline = Date.now() + (opts.timeout ?? defaultTimeout);
    const { token, w } = this.wait();
    const unwatch = watchAbort(opts.signal, w);
    try {
      const { job, batch } = this.message(key, toBytes(payload), opts, true, this.inbox + token);
      return await this.callBatch(job, batch, token, w, deadline, opts.signal, capJob(job, batch));
    } finally {
      unwatch();
      this.unwait(token);
    }
  }

  /** submitJSON is submit with value encoded as JSON. */
  async submitJSON<T>(key: string, value: T, opts?: JobOptions): Promise<string> {
    return this.submit(key, utf8(JSON.stringify(value)), opts);
  }

  /** callJSON is call with value encoded as JSON and the result decoded from JSON. */
  async callJSON<R = unknown, T = unknown>(key: string, value: T, opts?: JobOptions): Promise<R> {
    const res = await this.call(key, utf8(JSON.stringify(value)), opts);
    return JSON.parse(Buffer.from(res).toString("utf8")) as R;
  }

  /**
   * result reads a finished job's kept outcome from the results bucket:
   * its result, or a RemoteError; no_result when none is kept. A Go
   * client's batched Call (a job ID "<batch ID>.<index>", as a Go
   * NoReplyError names it) is read from its batch's entry too.
   * opts.signal stops the read (AbortedError). The read is a direct get
   * of the key's subject, which any replica answers: on a replicated
   * namespace, a replica that has not yet applied an outcome kept a
   * moment ago answers none, so no_result right after a call's answer
   * means "none kept yet", never that the job did not run (Go's
   * Client.Result says the same).
   */
  async result(id: string, opts: { timeout?: number; signal?: AbortSignal } = {}): Promise<Uint8Array> {
    notAborted(opts.signal, "result", id);
    validateJobID(id);
    const read = this.keptOrNull(id, Date.now() + (opts.timeout ?? this.requestTimeout), true);
    const kept = await abortable(read, opts.signal, () => new AbortedError("result", id, false, opts.signal?.reason));
    if (!kept) throw new KeylaneError("no_result", `keylane: no stored result (job ${id})`, id);
    return unwrap(kept);
  }

  /** close ends the client: waiting calls reject with closed. A connection made by connect is closed too. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.waiters.values()) w.push({ t: "closed" });
    this.sub?.unsubscribe();
    if (this.ownsConnection) await this.nc.close();
  }

  // runAtOf reads a job's delay options (runAtDecision) on this
  // namespace, now.
  private runAtOf(opts: JobOptions): Date | null {
    return runAtDecision(opts, Date.now(), this.info);
  }

  // batchRoom is the most bytes (by batchJobSize) the jobs of one batch
  // message take: max_payload less the dead letter's reserve, 1 KiB of
  // headers and the body's head, and at most the wire's limit on a body
  // (the Go client's batchRoom).
  private batchRoom(): number {
    const maxPayload = this.nc.info?.max_payload ?? 1024 * 1024;
    return Math.max(1, Math.min(maxPayload - DeadLetterReserve - 1024, MaxBatchBytes) - BatchHeaderSize);
  }

  // message builds the job with this namespace's settings: checked by
  // every rule and its size (buildJob), and its batch message: a batch of
  // one (as the Go client's message and batchMessage), the one format
  // every job travels in. In a batch a generated ID is <batch ID>.0 (the
  // worker refuses any other), and a caller's ID stays, flagged
  // idempotent. A job that goes alone (alone: never batched with others
  // by submitMany) is a delayed job's submission (on its ID's delay
  // subject, with Keylane-Run-At on the message), any job on a namespace
  // with a key backlog cap (on its key's subject, where the server counts
  // it against the cap, and a worker refuses a batch on the batch
  // subject), and a job too large for a batch of several (the wire's
  // MaxBatchBytes): a batch of one may be as large as max_payload less
  // DeadLetterReserve, and one larger is refused, payload_too_large,
  // before anything is sent.
  private message(key: string, payload: Uint8Array, opts: JobOptions, call: boolean, reply?: string): { job: Job; batch: BatchMessage; bj: BatchJob; alone: boolean } {
    const explicit = opts.id !== undefined;
    const maxPayload = this.nc.info?.max_payload ?? 1024 * 1024;
    const runAt = call ? null : this.runAtOf(opts);
    const batchID = this.batchIDs();
    const input = { key, payload, id: explicit ? opts.id! : batchedJobID(batchID, 0), explicit, type: opts.type, headers: opts.headers, reply, call, runAt: runAt ?? undefined };
    const job = buildJob(this.info, input, maxPayload);
    const bj = batchJobOf(input);
    const alone = runAt !== null || this.info.maxKeyBacklog > 0 || BatchHeaderSize + batchJobSize(bj) > MaxBatchBytes;
    const batch = buildBatch(this.info, partitionOf(key, this.info.partitions), batchID, [bj], { runAt: runAt ?? undefined, keySubject: this.info.maxKeyBacklog > 0 });
    const size = messageSize(batch.subject, batch.body, batch.headers);
    if (size > maxPayload - DeadLetterReserve) {
      throw new KeylaneError("payload_too_large", `keylane: ${size} bytes as a batch of one, limit ${maxPayload - DeadLetterReserve} (max_payload less ${DeadLetterReserve} for a dead letter's headers)`, explicit ? opts.id : undefined);
    }
    return { job, batch, bj, alone };
  }

  // publishBatch publishes copy n of batch b, its stream ack to token's
  // waiter marked with n. false: the copy did not leave (closed, draining).
  private publishBatch(b: BatchMessage, token: string, n: number): boolean {
    if (this.closed) return false;
    const h = natsHeaders();
    for (const [k, v] of b.headers) h.append(k, v);
    let ackTo = this.inbox + ackMark + token + ackMark + n;
    if (this.lostAcks > 0) {
      this.lostAcks--;
      ackTo = this.inbox + "lost"; // no waiter: the ack is lost
    }
    try {
      this.nc.publish(b.subject, b.body, { headers: h, reply: ackTo });
      return true;
    } catch {
      // A failed publish (closed, draining) is like a lost one: the ack
      // timer publishes again until the timeout.
      return false;
    }
  }

  // batchSend sends batch b's copies for token: every copy the same
  // message, the same batch ID and body, so the server stores the batch
  // once. first is the number of the first copy that left: a duplicate
  // answer to it means another message had the batch's ID before (not
  // stored); to a later copy, that our earlier copy was stored.
  private batchSend(b: BatchMessage, token: string) {
    const s = {
      copies: 0,
      first: -1,
      ackWait: ackWaitFirst,
      republishAt: 0,
      send: () => {
        const n = s.copies++;
        if (this.publishBatch(b, token, n) && s.first < 0) s.first = n;
        s.republishAt = Date.now() + s.ackWait;
        s.ackWait = Math.min(2 * s.ackWait, ackWaitMax);
      },
    };
    return s;
  }

  // batchAck reads a stream ack of batch b (what: "submit" or "call", id
  // the job's ID or the batch's label in messages, jobId the job's ID
  // when it is one job's): true when the batch is stored; false when it
  // must be published again (no leader, a transient refusal:
  // s.republishAt is set); { kept } when b is the batch of one of cj on a
  // namespace with a key backlog cap, refused for its key's cap, and the
  // job was stored before (PROTOCOL.md § 7: refusedAtCap): its kept
  // outcome when applied, null when still queued. It throws for a
  // refusal (a job refused at its cap and not stored before among them),
  // the stream's absence or another partition count (noStream), and a
  // duplicate answer to the batch's first copy.
  private async batchAck(e: { m: Msg; copy?: number }, s: ReturnType<Client["batchSend"]>, b: BatchMessage, what: string, id: string, jobId: string | undefined, deadline: number, cj?: CapJob): Promise<boolean | { kept: Outcome | null }> {
    const a = ackOf(e.m);
    if (a.noResponders) {
      await this.noStream(id, streamOf(b.headers));
      s.republishAt = Date.now() + noLeaderPause;
      return false;
    }
    const err = a.ack.error;
    const cls = classOf(a.ack);
    if (cls === "transient") {
      s.republishAt = Date.now() + noLeaderPause;
      return false;
    }
    if (err) {
      if (cls === "key_backlog_full" && cj) return { kept: await this.refusedAtCap(cj, deadline) };
      throw refusal(what, id, err, cls, jobId);
    }
    if (a.ack.duplicate && e.copy === s.first) {
      // The server had a message under the batch's ID before its first
      // copy: the batch was dropped, not stored. (Batch IDs are random:
      // not an accident.)
      throw new KeylaneError("batch_id_used", `keylane: ${what} ${id}: batch ID ${b.id} already used: not stored`, jobId);
    }
    return true;
  }

  // submitBatch is submit's (and submitMany's) path for batch b: resolved
  // once the batch is stored. A batch whose stream ack does not come is
  // published again whole, as it was (its batch ID), until the timeout.
  // id names it in errors (a job's ID, or the batch), jobId is the job's
  // ID when it is one job's.
  private async submitBatch(b: BatchMessage, id: string, jobId: string | undefined, deadline: number, signal?: AbortSignal, cj?: CapJob): Promise<void> {
    const { token, w } = this.wait();
    const unwatch = watchAbort(signal, w);
    try {
      const s = this.batchSend(b, token);
      s.send();
      for (;;) {
        const e = await w.next(Math.min(deadline, s.republishAt));
        if (e === null) {
          if (Date.now() >= deadline) {
            throw new KeylaneError("unknown_outcome", `keylane: submit ${id}: no stream ack before the timeout: stored or not, unknown; submit again with the same id`, jobId);
          }
          s.send();
          continue;
        }
        switch (e.t) {
          case "closed":
            throw new KeylaneError("closed", `keylane: submit ${id}: client closed`, jobId);
          case "aborted":
            throw new AbortedError("submit", id, true, signal?.reason);
          case "reconnect":
            s.republishAt = Date.now(); // a lost publish or ack: send it again now
            continue;
          case "refused":
            if (e.subject !== b.subject) continue;
            throw new KeylaneError("refused", `keylane: submit ${id}: refused by the server: ${e.error.message}`, jobId, { cause: e.error });
          case "ack": {
            const r = await this.batchAck(e, s, b, "submit", id, jobId, deadline, cj);
            if (r === true) return;
            if (r === false) continue;
            // Refused at its key's cap, but applied or still queued from
            // an earlier submit with this ID: nothing new stored.
            throw new KeylaneError("duplicate", `keylane: a job with this ID was stored before; nothing new stored (job ${id})`, jobId);
          }
        }
      }
    } finally {
      unwatch();
      this.unwait(token);
    }
  }

  // callBatch is call's path for a job in batch b, whose reply comes to
  // token's waiter w: the batch is published (again whole, as it was,
  // while no stream ack comes), then the reply awaited; a reply not come
  // within replyWait, or a reconnect, makes it read the kept outcome too:
  // by its ID, and for a generated ID (<batch ID>.0) in its batch's entry.
  private async callBatch(job: Job, b: BatchMessage, token: string, w: Waiter, deadline: number, signal?: AbortSignal, cj?: CapJob): Promise<Uint8Array> {
    const s = this.batchSend(b, token);
    let acked = false;
    let pollAt = Infinity; // when to read the kept outcome next
    s.send();
    for (;;) {
      const e = await w.next(Math.min(deadline, acked ? Infinity : s.republishAt, pollAt));
      if (e === null) {
        const now = Date.now();
        if (now >= deadline) throw new NoReplyError(job.id, "timeout");
        if (now >= pollAt) {
          const kept = await this.keptOrNull(job.id, deadline);
          if (kept) return unwrap(kept);
          pollAt = Date.now() + outcomePoll;
        }
        if (!acked && Date.now() >= s.republishAt) s.send();
        continue;
      }
      switch (e.t) {
        case "closed":
          throw new KeylaneError("closed", `keylane: call ${job.id}: client closed`, job.id);
        case "aborted":
          throw new AbortedError("call", job.id, true, signal?.reason);
        case "reconnect":
          // The reply may have been lost while away: read the kept
          // outcome too, and publish again if unacked.
          if (!acked) s.republishAt = Date.now();
          pollAt = Math.min(pollAt, Date.now());
          continue;
        case "refused":
          if (e.subject !== b.subject || acked) continue;
          throw new KeylaneError("refused", `keylane: call ${job.id}: refused by the server: ${e.error.message}`, job.id, { cause: e.error });
        case "result":
          return unwrap(decodeReply(getter(e.m.headers), e.m.data, job.id));
        case "held":
          throw new HeldError(job.id, getter(e.m.headers)(Header.Error) || "(no error text)", getter(e.m.headers)(Header.ErrorKind) === "held-epoch");
        case "ack": {
          if (acked) continue;
          const r = await this.batchAck(e, s, b, "call", job.id, job.id, deadline, cj);
          if (r === true) {
            acked = true;
            pollAt = Math.min(pollAt, Date.now() + replyWait);
          } else if (r !== false) {
            // Refused at its key's cap, stored by an earlier call with
            // this ID: its kept outcome, or (still queued) wait for it.
            if (r.kept) return unwrap(r.kept);
            acked = true; // nothing to publish again
            pollAt = Math.min(pollAt, Date.now());
          }
          continue;
        }
      }
    }
  }

  // noStream throws when a publish found no responder for a lasting
  // reason: the namespace's jobs stream is gone (no_topology), or it now
  // routes with another partition count (partition_mismatch). Otherwise
  // (no leader for a moment) it returns, and the job is published again.
  private async noStream(id: string, name: string): Promise<void> {
    let info: StreamInfo;
    try {
      const jsm = await jetstreamManager(this.nc, { timeout: this.requestTimeout, checkAPI: false });
      info = await jsm.streams.info(name);
    } catch (err) {
      if (jetStreamErrCode(err) === 10059) {
        throw new KeylaneError("no_topology", `keylane: submit ${id}: no responders: the jobs stream ${name} of namespace ${JSON.stringify(this.info.namespace)} does not exist`, id);
      }
      return;
    }
    const m = readMeta(info, this.info.namespace);
    if (m.partitions !== this.info.partitions) {
      throw new KeylaneError("partition_mismatch", `keylane: submit ${id}: the namespace was repartitioned since this client was opened (${m.partitions} partitions, this client ${this.info.partitions}): open it again`, id);
    }
  }

  // refusedAtCap answers the stream's refusal of job over its key's
  // backlog cap as the Go client's refused does: a job without the
  // caller's ID (nor a copy sent again) cannot have been stored before:
  // KeyBacklogFullError. One with it returns its kept outcome (applied
  // before), or null when it is queued from an earlier call (stored, it
  // runs); it is "full" only when the stream's leader says the key's
  // queue does not hold it, and unknown_outcome when that could not be
  // read: never "full" for a job that may have gone through.
  private async refusedAtCap(job: CapJob, deadline: number): Promise<Outcome | null> {
    const full = new KeyBacklogFullError(job.key, this.info.maxKeyBacklog, job.id);
    if (!job.idempotent) throw full;
    const unknown = (what: string, err: unknown) =>
      new KeylaneError("unknown_outcome", `keylane: key ${JSON.stringify(job.key)} is at its backlog cap, and whether job ${job.id} ${what} is unknown: ${String(err)}`, job.id, { cause: err });
    let kept: Outcome | null;
    try {
      kept = await this.keptOrNull(job.id, deadline, true);
    } catch (err) {
      throw unknown("was applied before", err);
    }
    if (kept) return kept;
    let queued: boolean;
    try {
      queued = await this.queued(job, deadline);
    } catch (err) {
      throw unknown("is queued from an earlier call", err);
    }
    if (queued) return null;
    // Not queued now; a copy acked while we looked had its outcome kept first.
    try {
      kept = await this.keptOrNull(job.id, deadline, true);
    } catch (err) {
      throw unknown("was applied before", err);
    }
    if (kept) return kept;
    throw full;
  }

  // queued reports whether the jobs stream holds a job with job's ID on
  // its key's subject, reading the key's messages from the stream's
  // leader ($JS.API.STREAM.MSG.GET, never a direct get, which a follower
  // may answer from behind): the subject's last message, then the others
  // in order up to it; at most the cap + 1 reads, each bounded.
  private async queued(job: CapJob, deadline: number): Promise<boolean> {
    const api = `$JS.API.STREAM.MSG.GET.${job.stream}`;
    const get = async (req: Record<string, unknown>): Promise<{ seq: number; found: boolean } | null> => {
      const bound = Math.max(1, Math.min(this.requestTimeout, deadline - Date.now()));
      const m = await this.nc.request(api, utf8(JSON.stringify(req)), { timeout: bound });
      const r = JSON.parse(Buffer.from(m.data).toString("utf8")) as {
        error?: { code: number; err_code?: number; description?: string };
        message?: { subject: string; seq: number; hdrs?: string; data?: string };
      };
      if (r.error?.err_code === 10037) return null; // no message
      if (r.error) throw new Error(`${api}: ${r.error.description ?? "error"} (err_code ${r.error.err_code ?? 0})`);
      const msg = r.message;
      if (!msg || msg.subject !== job.subject || (typeof req.seq === "number" && msg.seq < req.seq)) {
        throw new Error(`bad answer from ${api}`);
      }
      return { seq: msg.seq, found: jobIDOf(msg.hdrs, msg.data) === job.id };
    };
    const last = await get({ last_by_subj: job.subject });
    if (!last || last.found) return Boolean(last?.found);
    let seq = 1;
    for (let i = 0; i <= this.info.maxKeyBacklog; i++) {
      const at = await get({ seq, next_by_subj: job.subject });
      if (!at || at.found || at.seq >= last.seq) return Boolean(at?.found);
      seq = at.seq + 1;
    }
    throw new Error(`the key's subject ${job.subject} held more than its cap of ${this.info.maxKeyBacklog} jobs`);
  }

  // keptOrNull reads the outcome kept under id in the results bucket with
  // one bounded request; null when none is kept (or the read failed, and
  // then the caller's loop reads again). strict: a failed read throws.
  private async keptOrNull(id: string, deadline: number, strict = false): Promise<Outcome | null> {
    const bound = Math.max(1, Math.min(this.requestTimeout, deadline - Date.now()));
    try {
      if (!this.kv) {
        // The handle is kept for every later read: its requests get the
        // client's request timeout, never what this read had left (a
        // first read with 400 ms to go bound every read after it to 400
        // ms); withTimeout bounds each read by its caller's deadline.
        const js = jetstream(this.nc, { timeout: this.requestTimeout });
        this.kv = await withTimeout(new Kvm(js).open(this.names.results()), bound);
      }
      const e = await withTimeout(this.kv.get(id), bound);
      let value: Uint8Array | null = e && e.operation === "PUT" ? e.value : null;
      // A Go client's batched Call (its ID names its batch and index) may
      // have its outcome kept in its batch's entry instead: read there, as
      // the Go client does. An entry that is not this batch's, or holds
      // another job at the index, or does not decode, is an error, never
      // another job's outcome; one with no outcome at the index keeps
      // none for this job.
      const batched = value ? null : parseBatchedJobID(id);
      if (batched) {
        const be = await withTimeout(this.kv.get(batchOutcomesKey(batched.batchID)), bound);
        if (be && be.operation === "PUT") {
          try {
            value = findBatchOutcome(be.value, batched.batchID, batched.index, id);
          } catch (err) {
            throw new KeylaneError("refused", `keylane: stored outcome of ${id} in its batch's entry: ${(err as Error).message}`, id, { cause: err });
          }
        }
      }
      if (!value) return null;
      const o = decodeKept(value, id);
      if (!o) throw new KeylaneError("refused", `keylane: malformed stored result for ${id}`, id);
      return o;
    } catch (err) {
      if (strict || err instanceof KeylaneError) throw err;
      return null;
    }
  }

  private wait(): { token: string; w: Waiter } {
    if (this.closed) throw new KeylaneError("closed", "keylane: client closed");
    if (!this.sub) {
      this.sub = this.nc.subscribe(this.inbox + "*", {
        callback: (_err, m) => this.deliver(m),
      });
    }
    // Base 36 tokens without the grouped mark ("-"): workers reply to
    // this client one job at a time (no grouped replies to decode).
    const token = (++this.counter).toString(36);
    const w = new Waiter();
    this.waiters.set(token, w);
    return { token, w };
  }

  private unwait(token: string): void {
    this.waiters.delete(token);
  }

  private deliver(m: Msg): void {
    if (!m || !m.subject.startsWith(this.inbox)) return;
    const token = m.subject.slice(this.inbox.length);
    if (token.startsWith(ackMark)) {
      // "_<token>" (a one-job message's), "_<token>_<n>" (a batch's copy n)
      const rest = token.slice(1);
      const k = rest.indexOf(ackMark);
      if (k < 0) this.waiters.get(rest)?.push({ t: "ack", m });
      else this.waiters.get(rest.slice(0, k))?.push({ t: "ack", m, copy: Number(rest.slice(k + 1)) });
    } else if (token.startsWith(heldMark)) {
      this.waiters.get(token.slice(1))?.push({ t: "held", m });
    } else {
      this.waiters.get(token)?.push({ t: "result", m });
    }
  }

  // watchStatus tells every waiting job when the connection came back.
  private watchStatus(): void {
    void (async () => {
      try {
        for await (const s of this.nc.status()) {
          if (this.closed) return;
          if (s.type === "reconnect") {
            for (const w of this.waiters.values()) w.push({ t: "reconnect" });
          }
          // The server refused a publish (a permissions violation): the
          // job it names is never stored, and no ack will come.
          // Read by its shape: the connection may be another copy's of
          // the NATS packages (Client.open), whose error classes are not
          // the client's.
          const err: unknown = s.type === "error" ? (s as { error?: unknown }).error : undefined;
          const refusal = publishRefusal(err);
          if (refusal) {
            const e = { t: "refused" as const, subject: refusal.subject, error: err instanceof Error ? err : new Error(refusal.message) };
            for (const w of this.waiters.values()) w.push(e);
          }
        }
      } catch {
        // the connection closed
      }
    })();
  }
}

type Job = JobMessage;

// streamOf is the jobs stream a message names in Nats-Expected-Stream.
function streamOf(headers: Array<[string, string]>): string {
  return headers.find(([k]) => k === Header.ExpectedStream)![1];
}

// CapJob is what the answer to a refusal at a key's cap needs of a job
// (refusedAtCap): its key and ID, whether the ID is its caller's
// (idempotent), the key's subject it was published on and its stream.
interface CapJob {
  key: string;
  id: string;
  idempotent: boolean;
  subject: string;
  stream: string;
}

// capJob is job as refusedAtCap reads it, sent in b, its batch of one.
function capJob(job: Job, b: BatchMessage): CapJob {
  return { key: job.key, id: job.id, idempotent: job.idempotent, subject: b.subject, stream: streamOf(b.headers) };
}

// refusal is the error of a stream ack's refusal err of class cls.
function refusal(what: string, id: string, err: NonNullable<StreamAck["error"]>, cls: string, jobId?: string): KeylaneError {
  const why = cls === "limit" ? "the stream is at a limit (it lasts until jobs are removed): " : "";
  return new KeylaneError("refused", `keylane: ${what} ${id}: ${why}${err.description ?? "refused"} (code ${err.code}, err_code ${err.err_code ?? 0})`, jobId);
}

// rawHeader returns header name in a stored message's raw headers
// (base64 of "NATS/1.0\r\nName: value\r\n…"), or "".
function rawHeader(hdrs: string | undefined, name: string): string {
  if (!hdrs) return "";
  for (const line of Buffer.from(hdrs, "base64").toString("utf8").split("\r\n").slice(1)) {
    const i = line.indexOf(":");
    if (i > 0 && line.slice(0, i) === name) return line.slice(i + 1).trim();
  }
  return "";
}

// jobIDOf returns the ID of the job a stored message carries, from its
// raw headers and body (base64, as a message get answers them): a one-job
// message's Nats-Msg-Id, or the one job's ID in a batch of one (Go:
// jobIDOf). "" for anything else.
function jobIDOf(hdrs: string | undefined, data: string | undefined): string {
  if (!hdrs) return "";
  if (rawHeader(hdrs, Header.Batch) === "") return rawHeader(hdrs, Header.JobID);
  try {
    const jobs = decodeBatch(new Uint8Array(Buffer.from(data ?? "", "base64")));
    return jobs.length === 1 ? jobs[0].id : "";
  } catch {
    return "";
  }
}

// notAborted throws AbortedError (nothing sent) when signal has fired.
function notAborted(signal: AbortSignal | undefined, what: string, id?: string): void {
  if (signal?.aborted) throw new AbortedError(what, id, false, signal.reason);
}

// watchAbort tells w when signal fires; the returned function stops it.
function watchAbort(signal: AbortSignal | undefined, w: Waiter): () => void {
  if (!signal) return () => {};
  const on = () => w.push({ t: "aborted" });
  signal.addEventListener("abort", on, { once: true });
  return () => signal.removeEventListener("abort", on);
}

// abortable is p, or a rejection with aborted() once signal fires.
async function abortable<T>(p: Promise<T>, signal: AbortSignal | undefined, aborted: () => Error): Promise<T> {
  if (!signal) return p;
  let on: (() => void) | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        on = () => reject(aborted());
        signal.addEventListener("abort", on, { once: true });
      }),
    ]);
  } finally {
    if (on) signal.removeEventListener("abort", on);
  }
}

// errorOfJob is err as submitMany reports it for job id: a KeylaneError
// naming that job (one of its batch's, or its own).
function errorOfJob(err: unknown, id: string): KeylaneError {
  if (err instanceof KeylaneError && (err.jobId === id || id === "")) return err;
  if (err instanceof AbortedError) return new AbortedError("submit", id, err.sent, err.cause);
  if (err instanceof KeylaneError) return new KeylaneError(err.code, err.message, id, { cause: err });
  return new KeylaneError("unknown_outcome", `keylane: submit ${id}: ${String(err)}`, id, { cause: err });
}

function unwrap(o: Outcome): Uint8Array {
  if (o.ok) return o.result;
  throw o.error;
}

async function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        t = setTimeout(() => reject(new Error("timeout")), ms);
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}

/** connect opens a NATS connection and the namespace (Client.connect). */
export function connect(opts: ConnectOptions = {}): Promise<Client> {
  return Client.connect(opts);
}
