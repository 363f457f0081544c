// The shared conformance vectors (testdata/conformance at the repository
// root, written from the Go code by TestConformanceVectors): this client
// must hash, route, validate, build and read exactly as the Go code does.
// Batch messages are what it sends (batches.json: byte for byte); vectors
// for what it never does (grouped replies) are checked only where they
// concern it; batch outcome entries it reads (result(id), and a call
// recovering a lost reply).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  HashName,
  MaxDelay,
  RunAtTolerance,
  KeylaneError,
  batchOutcomesKey,
  batchJobOf,
  buildBatch,
  batchedJobID,
  classOf,
  runAtDecision,
  decodeBatch,
  encodeBatch,
  validBatchID,
  decodeBatchOutcomes,
  findBatchOutcome,
  parseBatchedJobID,
  RemoteError,
  buildJob,
  decodeKept,
  decodeReply,
  heldSubject,
  keyToken,
  markRetry,
  parseStreamAck,
  partitionOf,
  validJobID,
  validPartitionCount,
  validReply,
  validateKey,
  validateType,
  validateUserHeader,
  xxhash64,
} from "@keylane/client";

const dir = new URL("../../../../testdata/conformance/", import.meta.url);
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const load = (name: string): any => {
  const v = JSON.parse(readFileSync(new URL(name, dir), "utf8"));
  assert.equal(v.protocol, "keylane wire protocol v1", `${name}: protocol`);
  return v;
};
const hex = (h: string) => new Uint8Array(Buffer.from(h, "hex"));
const toHex = (b: Uint8Array) => Buffer.from(b).toString("hex");
// utf8OrNull decodes bytes that are valid UTF-8, else null: a JS string
// cannot hold them, so this client can never send them.
const utf8OrNull = (b: Uint8Array): string | null => {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(b);
  } catch {
    return null;
  }
};
const throwsCode = (f: () => void): string | null => {
  try {
    f();
    return null;
  } catch (err) {
    assert.ok(err instanceof KeylaneError, String(err));
    return err.code;
  }
};

test("keys.json: hash, token and partition of every key", () => {
  const { hash, vectors } = load("keys.json");
  assert.equal(hash, HashName, "the keylane.hash this client routes by");
  assert.ok(vectors.length > 0);
  for (const v of vectors) {
    const bytes = hex(v.key_hex);
    assert.equal(xxhash64(bytes).toString(16).padStart(16, "0"), v.xxhash64_hex, v.name);
    assert.equal(xxhash64(bytes).toString(10), v.xxhash64_dec, v.name);
    const key = utf8OrNull(bytes);
    assert.notEqual(key, null, `${v.name}: every key of keys.json is valid`);
    assert.equal(keyToken(key!), v.token, v.name);
    validateKey(key!);
    for (const { count, partition } of v.partitions) {
      assert.equal(partitionOf(key!, count), partition, `${v.name} mod ${count}`);
    }
  }
});

test("validation.json: the client accepts exactly the valid inputs", () => {
  const { vectors } = load("validation.json");
  const seen = new Set<string>();
  for (const v of vectors) {
    const bytes = hex(v.value_hex ?? "");
    const s = utf8OrNull(bytes);
    let valid: boolean;
    switch (v.field) {
      case "key":
        valid = s !== null && throwsCode(() => validateKey(s)) === null;
        if (!valid && s !== null) assert.equal(throwsCode(() => validateKey(s)), "bad_key", v.name);
        break;
      case "job_id":
        valid = s !== null && validJobID(s);
        break;
      case "type":
        valid = s !== null && throwsCode(() => validateType(s)) === null;
        break;
      case "header": {
        const code = s === null ? "bad_header" : throwsCode(() => validateUserHeader(s, v.header_value ?? ""));
        valid = code === null;
        if (!valid) assert.match(code!, /^(reserved_header|bad_header)$/, v.name);
        if (!valid && /reserved/.test(v.error)) assert.equal(code, "reserved_header", v.name);
        break;
      }
      case "reply":
        valid = s !== null && validReply(s, v.reply_prefix);
        break;
      case "partitions":
        valid = validPartitionCount(Number(v.value));
        break;
      case "batch_id":
        valid = s !== null && validBatchID(s);
        break;
      default:
        assert.fail(`${v.name}: unknown field ${v.field}`);
    }
    seen.add(v.field);
    assert.equal(valid, v.valid, `${v.name} (${v.field} ${JSON.stringify(v.value)}): ${v.error}`);
  }
  for (const f of ["key", "job_id", "type", "header", "reply", "partitions", "batch_id"]) assert.ok(seen.has(f), `no ${f} vectors`);
});

test("jobs.json: job messages byte for byte", () => {
  const { vectors } = load("jobs.json");
  assert.ok(vectors.length > 0);
  for (const v of vectors) {
    const ns = { namespace: v.namespace, partitions: v.partitions, shards: v.shards, replyPrefix: v.reply_prefix };
    const i = v.input;
    const m = buildJob(
      ns,
      {
        key: i.key,
        payload: hex(i.payload_hex),
        id: i.id,
        explicit: !i.id_generated,
        type: i.type,
        headers: i.headers,
        reply: i.reply === "" ? undefined : i.reply,
        call: i.call,
      },
      1024 * 1024,
    );
    if (i.retry) markRetry(m);
    assert.equal(m.subject, v.message.subject, v.name);
    assert.equal(toHex(m.payload), v.message.payload_hex, v.name);
    const got: Record<string, string[]> = {};
    for (const [k, val] of m.headers) (got[k] ??= []).push(val);
    assert.deepEqual(got, v.message.headers, v.name);
    assert.equal(m.id, v.parsed.id, v.name);
    assert.equal(m.idempotent, v.parsed.idempotent, v.name);
    assert.equal(partitionOf(i.key, v.partitions), v.parsed.partition, v.name);
    if (i.id_generated) assert.match(i.id, /^[A-Za-z0-9]{22}$/, `${v.name}: a generated ID is a nuid`);
  }
});

test("batches.json: batch messages byte for byte", () => {
  const { vectors } = load("batches.json");
  assert.ok(vectors.length > 0);
  for (const v of vectors) {
    const ns = { namespace: v.namespace, partitions: v.partitions, shards: v.shards, replyPrefix: v.reply_prefix };
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const jobs = v.jobs.map((j: any) => {
      const input = {
        key: j.key,
        payload: hex(j.payload_hex),
        id: j.id,
        explicit: j.idempotent,
        type: j.type,
        headers: j.headers,
        reply: j.reply === "" ? undefined : j.reply,
        call: j.keep_outcome,
      };
      buildJob(ns, input, 1024 * 1024); // every rule the client checks before sending
      assert.equal(partitionOf(j.key, v.partitions), v.partition, v.name);
      return batchJobOf(input);
    });
    const m = buildBatch(ns, v.partition, v.batch_id, jobs);
    assert.equal(m.id, v.batch_id, v.name);
    assert.equal(m.subject, v.message.subject, v.name);
    assert.equal(toHex(m.body), v.message.body_hex, v.name);
    assert.equal(toHex(encodeBatch(jobs)), v.message.body_hex, v.name);
    const got: Record<string, string[]> = {};
    for (const [k, val] of m.headers) (got[k] ??= []).push(val);
    assert.deepEqual(got, v.message.headers, v.name);
    // And read back: the same jobs.
    const back = decodeBatch(hex(v.message.body_hex));
    assert.equal(back.length, jobs.length, v.name);
    back.forEach((b, k) => {
      assert.deepEqual({ ...b, payload: toHex(b.payload) }, { ...jobs[k], payload: toHex(jobs[k].payload) }, `${v.name} job ${k}`);
    });
  }
});

test("batch bodies: every uvarint shortest, header names in byte order, refused when broken", () => {
  const job = (over: object) => ({ key: "k", id: "Gj2Qhk3TYhYAmoxTQJcHq0.0", type: "", reply: "", keepOutcome: false, idempotent: false, headers: {}, payload: new Uint8Array(0), ...over });
  // A 200-byte payload takes a two-byte length (0xc8 0x01).
  const big = encodeBatch([job({ payload: new Uint8Array(200) })]);
  assert.equal(toHex(big.subarray(big.length - 202, big.length - 200)), "c801");
  // Names sorted by bytes ("X-B" < "X-a"), whatever order they were given in.
  const b = encodeBatch([job({ headers: { "X-a": ["1"], "X-B": ["2", ""] }, keepOutcome: true, idempotent: true, id: "order-1" })]);
  assert.deepEqual(Object.keys(decodeBatch(b)[0].headers), ["X-B", "X-a"]);
  assert.equal(decodeBatch(b)[0].keepOutcome && decodeBatch(b)[0].idempotent, true);
  // Broken framing is refused: trailing bytes, a long-form uvarint, a cut body, an unknown flag.
  const plain = encodeBatch([job({})]);
  const refuse = (x: Uint8Array) => assert.throws(() => decodeBatch(x), (e: unknown) => e instanceof KeylaneError && e.code === "refused");
  refuse(new Uint8Array([...plain, 0]));
  refuse(new Uint8Array([...plain.subarray(0, 4), 0x81, 0x00, ...plain.subarray(5)]));
  refuse(plain.subarray(0, plain.length - 1));
  const at = 4 + 1 + 2 + 25 + 1 + 1; // the flags byte: after magic and version, count, key, ID, type, reply
  const flags = new Uint8Array(plain);
  flags[at] = 1;
  assert.equal(decodeBatch(flags)[0].keepOutcome, true);
  flags[at] = 4;
  refuse(flags);
  assert.throws(() => encodeBatch([]), KeylaneError);
});

test("outcomes.json: kept outcomes", () => {
  const { kept } = load("outcomes.json");
  assert.ok(kept.length > 0);
  for (const v of kept) {
    const o = decodeKept(hex(v.value_hex));
    assert.ok(o, v.name);
    if (v.kind === "ok") {
      assert.ok(o.ok, v.name);
      assert.equal(toHex(o.result), v.result_hex, v.name);
    } else {
      assert.ok(!o.ok, v.name);
      assert.ok(o.error instanceof RemoteError);
      assert.equal(o.error.kind, v.kind, v.name);
      assert.equal(o.error.remoteMessage, v.error, v.name);
    }
  }
  assert.equal(decodeKept(new Uint8Array(0)), null, "an empty value is no outcome");
});

test("outcomes.json: batch entries, their refusals, look-ups and batched job IDs", () => {
  const { batch_entries, bad_batch_entries, lookups, batched_ids } = load("outcomes.json");
  assert.ok(batch_entries.length > 0 && bad_batch_entries.length > 0 && lookups.length > 0 && batched_ids.length > 0);
  for (const v of batch_entries) {
    const e = decodeBatchOutcomes(hex(v.entry_hex));
    assert.equal(e.batchID, v.batch_id, v.name);
    assert.equal(batchOutcomesKey(e.batchID), v.key, v.name);
    assert.deepEqual(
      e.outcomes.map((o) => ({ index: o.index, id: o.id, value_hex: toHex(o.value) })),
      v.outcomes,
      v.name,
    );
  }
  for (const v of bad_batch_entries) {
    assert.equal(throwsCode(() => decodeBatchOutcomes(hex(v.entry_hex))), "refused", `${v.name}: Go refuses it (${v.error})`);
  }
  for (const v of lookups) {
    const none = !v.found && v.error.startsWith("wire: batch outcomes entry holds no outcome");
    let got: Uint8Array | null = null;
    const code = throwsCode(() => {
      got = findBatchOutcome(hex(v.entry_hex), v.batch_id, v.index, v.id);
    });
    if (v.found) {
      assert.equal(code, null, v.name);
      assert.equal(toHex(got!), v.value_hex, v.name);
    } else if (none) {
      assert.equal(code, null, v.name);
      assert.equal(got, null, `${v.name}: no outcome at the index is none, not an error`);
    } else {
      assert.equal(code, "refused", `${v.name}: Go refuses it (${v.error})`);
    }
  }
  for (const v of batched_ids) {
    const p = parseBatchedJobID(v.id);
    assert.deepEqual(p, v.ok ? { batchID: v.batch_id, index: v.index } : null, v.id);
  }
});

test("batch entries, mutated: refused or read whole, never a throw of another kind", () => {
  // The decoder's fuzz: a fixed-seed walk of one- to three-byte
  // mutations and cuts of each good entry.
  const { batch_entries } = load("outcomes.json");
  let seed = 0x2545f491;
  const rand = (n: number) => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) % n;
  };
  let refused = 0;
  for (const v of batch_entries) {
    const good = hex(v.entry_hex);
    for (let k = 0; k < 3000; k++) {
      const b = good.slice(0, good.length - (rand(4) === 0 ? rand(good.length) : 0));
      for (let m = 0; m <= rand(3) && b.length > 0; m++) b[rand(b.length)] = rand(256);
      try {
        const e = decodeBatchOutcomes(b);
        for (const o of e.outcomes) {
          assert.equal(o.id, `${e.batchID}.${o.index}`, "a decoded outcome's ID is its batch and index");
          assert.ok(o.value.length > 0);
        }
      } catch (err) {
        assert.ok(err instanceof KeylaneError && err.code === "refused", String(err));
        refused++;
      }
    }
  }
  assert.ok(refused > 0);
});

test("replies.json: single replies, held notices, stream acks", () => {
  const { single, held, stream_acks } = load("replies.json");
  for (const v of single) {
    const h: Record<string, string[]> = v.headers;
    const o = decodeReply((name) => (h[name] ? h[name][0] : undefined), hex(v.data_hex));
    assert.equal(o.ok, v.decoded.ok, v.name);
    if (o.ok) {
      assert.equal(toHex(o.result), v.decoded.result_hex, v.name);
    } else {
      assert.equal(o.error.remoteMessage, v.decoded.error, v.name);
      assert.equal(o.error.kind, v.decoded.kind, v.name);
      assert.equal(o.error.permanent, v.decoded.permanent, v.name);
      assert.equal(o.error.deadLettered, v.decoded.dead_lettered, v.name);
    }
  }
  for (const v of held) {
    assert.equal(heldSubject(v.reply), v.subject, v.name);
  }
  for (const v of stream_acks) {
    const a = parseStreamAck(hex(v.data_hex));
    assert.equal(!a.error, v.stored, v.name);
    assert.equal(Boolean(a.duplicate), v.duplicate, v.name);
    assert.equal(a.error?.err_code ?? 0, v.error_code, v.name);
    // What the client makes of it (PROTOCOL.md § 7): classified by
    // err_code, as the Go client did.
    assert.equal(classOf(a), v.class, `${v.name}: ${Buffer.from(hex(v.data_hex)).toString()}`);
  }
});

test("delays.json: the client's rules for a run-at time", () => {
  const { run_at_rules, max_delay_ms, run_at_tolerance_ms } = load("delays.json");
  assert.equal(max_delay_ms, MaxDelay);
  assert.equal(run_at_tolerance_ms, RunAtTolerance);
  assert.ok(run_at_rules.length > 0);
  const codeOf: Record<string, string> = { ErrBadDelay: "bad_delay", ErrDelaysOff: "delays_off" };
  const now = Date.parse("2026-11-27T11:00:00Z");
  for (const v of run_at_rules) {
    const runAt = new Date(now + v.offset_ms);
    let got: string;
    try {
      got = runAtDecision({ runAt }, now, { namespace: "keylane", delays: v.delays }) === null ? "now" : "delayed";
    } catch (err) {
      assert.ok(err instanceof KeylaneError, String(err));
      got = err.code;
    }
    assert.equal(got, v.result === "refused" ? codeOf[v.go_error] : v.result, `${v.name}: Go ${v.result} ${v.go_error}`);
  }
});

test("delays.json: delayed submissions byte for byte (a batch of one on the ID's delay subject)", () => {
  const { submissions } = load("delays.json");
  assert.ok(submissions.length > 0);
  for (const v of submissions) {
    const ns = { namespace: v.namespace, partitions: v.partitions, shards: v.shards, replyPrefix: v.reply_prefix };
    const i = v.input;
    // The vector's batch ID is the Go client's random one: this client
    // builds its submission under the same ID.
    const batchID = v.message.headers["Nats-Msg-Id"][0];
    assert.ok(validBatchID(batchID), v.name);
    if (i.id_generated) assert.equal(i.id, batchedJobID(batchID, 0), `${v.name}: a generated ID is its batch's`);
    const runAt = new Date(i.run_at);
    const input = { key: i.key, payload: hex(i.payload_hex), id: i.id, explicit: !i.id_generated, type: i.type, headers: i.headers, runAt };
    buildJob(ns, input, 1024 * 1024); // every rule the client checks before sending
    const p = partitionOf(i.key, v.partitions);
    assert.equal(p, v.parsed.partition, v.name);
    const m = buildBatch(ns, p, batchID, [batchJobOf(input)], { runAt });
    assert.equal(m.subject, v.message.subject, v.name);
    assert.equal(toHex(m.body), v.message.payload_hex, v.name);
    const got: Record<string, string[]> = {};
    for (const [k, val] of m.headers) (got[k] ??= []).push(val);
    assert.deepEqual(got, v.message.headers, v.name);
    const [j] = decodeBatch(m.body);
    assert.deepEqual({ id: j.id, key: j.key, type: j.type, idempotent: j.idempotent }, { id: v.parsed.id, key: v.parsed.key, type: v.parsed.type, idempotent: v.parsed.idempotent }, v.name);
  }
});
