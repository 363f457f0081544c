// The client against a real nats-server and a real Go worker running
// keylane's inventory reducer. The Go test clients/node/node_test.go
// starts both and runs this file with KEYLANE_NATS_URL and
// KEYLANE_NAMESPACE set; without them every test here is skipped.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, connect as tcpConnect, type AddressInfo } from "node:net";
import { jetstreamManager } from "@nats-io/jetstream";
import type { Msg, NatsConnection } from "@nats-io/nats-core";
import { after, before, describe, test } from "node:test";
import { connect as otherConnect } from "nats-other";
import { AbortedError, Client, HeldError, KeyBacklogFullError, KeylaneError, NoReplyError, RemoteError, connect, decodeBatch, formatRunAt, keyToken, Names, partitionOf, validBatchID, type BatchJob } from "@keylane/client";

const url = process.env.KEYLANE_NATS_URL;
const namespace = process.env.KEYLANE_NAMESPACE;
const jsonNamespace = process.env.KEYLANE_JSON_NAMESPACE;
const capNamespace = process.env.KEYLANE_CAP_NAMESPACE;
const permURL = process.env.KEYLANE_PERM_URL;
const bigURL = process.env.KEYLANE_BIG_URL;
const bigNamespace = process.env.KEYLANE_BIG_NAMESPACE;
const heldNamespace = process.env.KEYLANE_HELD_NAMESPACE;
const delayNamespace = process.env.KEYLANE_DELAY_NAMESPACE;
// Without a server the suite skips, but never under CI: there a suite
// that did not run fails (see before).
const noServer = !url || !namespace ? "KEYLANE_NATS_URL and KEYLANE_NAMESPACE not set (run by clients/node/node_test.go, or npm test)" : "";
const skip = noServer && !process.env.CI ? noServer : false;

const text = (b: Uint8Array) => Buffer.from(b).toString("utf8");
let seq = 0;
const uniq = (what: string) => `${what}-${process.pid}-${Date.now().toString(36)}-${++seq}`;

// sniff records every message published on subject (a wildcard of the
// namespace's jobs subjects) until stop: what the client put on the wire.
async function sniff(nc: NatsConnection, subject: string): Promise<{ msgs: Msg[]; stop: () => void }> {
  const msgs: Msg[] = [];
  const sub = nc.subscribe(subject, { callback: (_err, m) => void msgs.push(m) });
  await nc.flush();
  return { msgs, stop: () => sub.unsubscribe() };
}

// A batch message as seen on the wire: its batch ID, headers and jobs.
interface SeenBatch {
  subject: string;
  batchID: string;
  header: (name: string) => string | undefined;
  body: string;
  jobs: BatchJob[];
}

function seenBatch(m: Msg): SeenBatch {
  const header = (name: string) => (m.headers?.has(name) ? m.headers.get(name) : undefined);
  return { subject: m.subject, batchID: header("Nats-Msg-Id") ?? "", header, body: Buffer.from(m.data).toString("hex"), jobs: decodeBatch(m.data) };
}

// batchesOf returns the batch messages among msgs that carry a job of key.
function batchesOf(msgs: Msg[], key: string): SeenBatch[] {
  return msgs.filter((m) => m.subject.endsWith(".batch")).map(seenBatch).filter((b) => b.jobs.some((j) => j.key === key));
}

// once drops the copies of a batch published again (its ack was late,
// as on a loaded machine): every copy is the same bytes under the same
// batch ID.
function once(seen: SeenBatch[]): SeenBatch[] {
  const first = new Map<string, SeenBatch>();
  for (const b of seen) {
    const f = first.get(b.batchID);
    if (f) assert.equal(b.body, f.body, `batch ${b.batchID} published again with other bytes`);
    else first.set(b.batchID, b);
  }
  return [...first.values()];
}

// expectCode asserts that p rejects with a KeylaneError of code.
async function expectCode(p: Promise<unknown>, code: string): Promise<KeylaneError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof KeylaneError, `want a KeylaneError ${code}, got ${String(err)}`);
    assert.equal(err.code, code, `error ${err.message}`);
    return err;
  }
  assert.fail(`want a KeylaneError ${code}, got success`);
}

describe("keylane client against a Go worker", { skip }, () => {
  let c: Client;
  before(async () => {
    if (noServer) throw new Error(`CI=${process.env.CI} and the server suite cannot run: ${noServer}`);
    c = await connect({ servers: url, namespace });
  });
  after(async () => {
    await c?.close();
  });

  test("reads the namespace's settings", () => {
    assert.ok(c.partitions >= 1);
    assert.equal(c.info.namespace, namespace);
    // keylane.batches is gone (every worker reads batch messages): a
    // namespace set up by this release does not say it.
    assert.equal(c.info.batches, false);
  });

  test("call returns the handler's result", async () => {
    const sku = uniq("sku");
    assert.equal(text(await c.call(sku, "set 5")), "ok 5");
    assert.equal(text(await c.call(sku, "buy 2")), "sold 3");
    assert.equal(text(await c.call(sku, "get")), "stock 3");
  });

  test("result(id) of a Go client's batched Call reads its batch's entry", async () => {
    // node_test.go's batchedCall: a Go client's Calls went in batch
    // messages, whose outcomes the workers kept per batch.
    const id = process.env.KEYLANE_BATCHED_ID;
    assert.ok(id, "KEYLANE_BATCHED_ID not set");
    assert.equal(text(await c.result(id)), process.env.KEYLANE_BATCHED_RESULT);
    // Another batch's entry, garbled: refused, never read as an answer.
    const err = await expectCode(c.result(process.env.KEYLANE_GARBLED_BATCHED_ID!, { timeout: 5000 }), "refused");
    assert.match(err.message, /in its batch's entry: keylane: malformed batch outcomes entry/);
    // A batch with no entry keeps nothing for the job.
    await expectCode(c.result("Aa1Aa1Aa1Aa1Aa1Aa1Aa1A.3", { timeout: 2000 }), "no_result");
  });

  test("submit stores the job, which then runs", async () => {
    const sku = uniq("sku");
    await c.call(sku, "set 10");
    const id = await c.submit(sku, "buy 4");
    // A batch of one: its batch's ID and its index.
    assert.match(id, /^[A-Za-z0-9]{22}\.0$/);
    // Jobs of one key run in order: a call after the submit sees it.
    assert.equal(text(await c.call(sku, "get")), "stock 6");
  });

  test("submit with an id again: stored again, answered from the kept outcome, applied once", async () => {
    // The one wire path: the server no longer de-duplicates a caller's ID
    // (it travels in a batch, flagged idempotent); the worker looks it up
    // and answers a second copy from the first's kept outcome. Before, the
    // second submit was refused with duplicate.
    const sku = uniq("sku");
    await c.call(sku, "set 10");
    const id = uniq("order");
    assert.equal(await c.submit(sku, "buy 1", { id }), id);
    assert.equal(await c.submit(sku, "buy 1", { id }), id);
    assert.equal(text(await c.call(sku, "get")), "stock 9");
    // Its outcome is kept by ID.
    assert.equal(text(await c.result(id)), "sold 9");
  });

  test("every job travels in a batch message of one, on its partition's batch subject", async () => {
    const s = await sniff(c.nc, `${namespace}.jobs.>`);
    const sku = uniq("sku");
    const callID = uniq("order");
    let generated: string;
    let submitID: string;
    try {
      assert.equal(text(await c.call(sku, "set 10")), "ok 10");
      generated = await c.submit(sku, "buy 1", { type: "t1", headers: { "X-Tag": ["a", "b"], "X-Empty": "" } });
      submitID = await c.submit(sku, "buy 1", { id: uniq("order") });
      assert.equal(text(await c.call(sku, "buy 2", { id: callID })), "sold 6");
    } finally {
      s.stop();
    }
    // Nothing on the key's own subject: no one-job message.
    assert.deepEqual(s.msgs.filter((m) => m.subject.endsWith("." + keyToken(sku))).map((m) => m.subject), []);
    const seen = once(batchesOf(s.msgs, sku));
    assert.equal(seen.length, 4, "four jobs, four batch messages");
    const p = partitionOf(sku, c.partitions);
    for (const b of seen) {
      assert.equal(b.subject, `${namespace}.jobs.${p}.batch`);
      assert.ok(validBatchID(b.batchID), `batch ID ${b.batchID}`);
      assert.equal(b.header("Keylane-Batch"), "1");
      assert.equal(b.header("Keylane-Batch-Jobs"), "1");
      assert.equal(b.header("Keylane-Partitions"), String(c.partitions));
      assert.match(b.header("Nats-Expected-Stream") ?? "", /_JOBS(_[0-9]+)?$/);
      assert.equal(b.header("Keylane-Key"), undefined, "a batch carries its jobs' keys in the body");
      assert.equal(b.jobs.length, 1);
    }
    const [set, gen, withID, call] = seen.map((b) => ({ b, j: b.jobs[0] }));
    // A call: its reply subject and keep-outcome in the body; a generated ID <batch ID>.0.
    assert.equal(set.j.id, `${set.b.batchID}.0`);
    assert.ok(set.j.keepOutcome && !set.j.idempotent && set.j.reply.startsWith("_INBOX."));
    assert.equal(text(set.j.payload), "set 10");
    // A submit: no reply, no flag; its type and headers in the body.
    assert.equal(gen.j.id, generated);
    assert.equal(gen.j.id, `${gen.b.batchID}.0`);
    assert.ok(!gen.j.keepOutcome && !gen.j.idempotent && gen.j.reply === "");
    assert.equal(gen.j.type, "t1");
    assert.deepEqual(gen.j.headers, { "X-Empty": [""], "X-Tag": ["a", "b"] });
    // A caller's ID stays, flagged idempotent; the batch has an ID of its own.
    assert.equal(withID.j.id, submitID);
    assert.ok(withID.j.idempotent && !withID.j.keepOutcome);
    assert.notEqual(withID.b.batchID, submitID);
    assert.equal(call.j.id, callID);
    assert.ok(call.j.idempotent && call.j.keepOutcome && call.j.reply.startsWith("_INBOX."));
    assert.equal(text(await c.call(sku, "get")), "stock 6");
  });

  test("a batch whose stream ack is lost is published again whole, under its batch ID: stored once, run once", async () => {
    const sku = uniq("sku");
    await c.call(sku, "set 10");
    const s = await sniff(c.nc, `${namespace}.jobs.*.batch`);
    const priv = c as unknown as { lostAcks: number };
    try {
      priv.lostAcks = 1; // the first copy's ack goes astray
      const id = await c.submit(sku, "buy 1");
      priv.lostAcks = 1;
      assert.equal(text(await c.call(sku, "buy 2")), "sold 7");
      assert.equal(text(await c.call(sku, "get")), "stock 7");
      const seen = batchesOf(s.msgs, sku);
      const buy1 = seen.filter((b) => text(b.jobs[0].payload) === "buy 1");
      const buy2 = seen.filter((b) => text(b.jobs[0].payload) === "buy 2");
      // The submit's batch went again after its ack wait: the same batch
      // ID and the same bytes, which the server drops as its copy (the
      // duplicate answer to a later copy is ours: submit resolves).
      // (Twice, or more when a copy's ack is late on a loaded machine.)
      assert.ok(buy1.length >= 2, "the submit's batch sent again");
      assert.equal(once(buy1).length, 1, "every copy the same batch ID and bytes");
      assert.equal(id, `${buy1[0].batchID}.0`);
      // The call's reply proves its batch stored: it may come before the
      // ack wait ends (one copy), or after a copy went again (the same).
      assert.ok(buy2.length >= 1 && buy2.every((b) => b.batchID === buy2[0].batchID && b.body === buy2[0].body));
      assert.notEqual(buy1[0].batchID, buy2[0].batchID);
    } finally {
      priv.lostAcks = 0;
      s.stop();
    }
  });

  test("a batch whose ID the stream already holds: batch_id_used, not stored, never run", async () => {
    const sku = uniq("sku");
    await c.call(sku, "set 10");
    const priv = c as unknown as { batchIDs: () => string };
    const used = "Us3dUs3dUs3dUs3d" + Math.random().toString(36).replace(/[^a-z0-9]/g, "").padEnd(6, "x").slice(0, 6);
    const own = priv.batchIDs;
    try {
      priv.batchIDs = () => used;
      assert.equal(await c.submit(sku, "buy 1"), `${used}.0`);
      // A duplicate answer to a batch's first copy: another message had its ID.
      const e1 = await expectCode(c.submit(sku, "buy 1"), "batch_id_used");
      assert.match(e1.message, /already used: not stored/);
      await expectCode(c.call(sku, "buy 1", { id: uniq("order") }), "batch_id_used");
    } finally {
      priv.batchIDs = own;
    }
    assert.equal(text(await c.call(sku, "get")), "stock 9");
  });

  test("a call retried by its id, copies queued at once: run once, every copy answered with its outcome", async () => {
    const sku = uniq("sku");
    await c.call(sku, "set 5");
    const id = uniq("order");
    const s = await sniff(c.nc, `${namespace}.jobs.*.batch`);
    let answers: string[];
    try {
      // Three copies of one job in flight at once (a retry that met its
      // first copy): the server stores each (no de-duplication of a job
      // in a batch); the worker runs the first and answers the others
      // from its kept outcome.
      answers = (await Promise.all([1, 2, 3].map(() => c.call(sku, "buy 1", { id })))).map(text);
    } finally {
      s.stop();
    }
    assert.deepEqual(answers, ["sold 4", "sold 4", "sold 4"]);
    const seen = once(batchesOf(s.msgs, sku));
    assert.equal(seen.length, 3);
    assert.equal(new Set(seen.map((b) => b.batchID)).size, 3, "three batches, each its own ID");
    for (const b of seen) assert.ok(b.jobs[0].id === id && b.jobs[0].idempotent);
    // Later, by ID again: the same outcome, still applied once.
    assert.equal(text(await c.call(sku, "buy 1", { id })), "sold 4");
    assert.equal(text(await c.call(sku, "get")), "stock 4");
  });

  test("JSON helpers: submitJSON, callJSON", { skip: jsonNamespace ? false : "KEYLANE_JSON_NAMESPACE not set" }, async () => {
    // The harness's second namespace runs a Go handler that answers
    // {"key": <the job's key>, "got": <the JSON payload>}.
    const j = await Client.open(c.nc, { namespace: jsonNamespace });
    try {
      const key = uniq("doc");
      const { at: _at, ...got } = await j.callJSON<{ key: string; got: { n: number; tags: string[] }; at: number }>(key, { n: 3, tags: ["a", "é"] });
      assert.deepEqual(got, { key, got: { n: 3, tags: ["a", "é"] } });
      const id = uniq("doc-job");
      assert.equal(await j.submitJSON(key, { n: 4 }, { id }), id);
      // The result of a job with an id is kept by it once the job ran.
      let kept: unknown;
      for (let i = 0; i < 100 && kept === undefined; i++) {
        try {
          const { at: _at, ...rest } = JSON.parse(text(await j.result(id))) as Record<string, unknown>;
          kept = rest;
        } catch (err) {
          assert.ok(err instanceof KeylaneError && err.code === "no_result", String(err));
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      assert.deepEqual(kept, { key, got: { n: 4 } });
    } finally {
      await j.close();
    }
  });

  test("retry by id after no reply: answered from the kept outcome, applied once", async () => {
    const sku = uniq("sku");
    await c.call(sku, "set 3");
    const id = uniq("order");
    // timeout 0 waits for nothing: the job is published, the call rejects
    // with no_reply at once, and the job may or may not be stored.
    const first = await expectCode(c.call(sku, "buy 1", { id, timeout: 0 }), "no_reply");
    assert.ok(first instanceof NoReplyError);
    assert.equal(first.jobId, id);
    // Called again with the same id: the outcome, never a second run.
    const again = text(await c.call(sku, "buy 1", { id }));
    assert.equal(again, "sold 2");
    const third = text(await c.call(sku, "buy 1", { id }));
    assert.equal(third, "sold 2");
    assert.equal(text(await c.call(sku, "get")), "stock 2");
  });

  test("a handler error comes back as a RemoteError", async () => {
    const err = await expectCode(c.call(uniq("sku"), "bogus"), "remote");
    assert.ok(err instanceof RemoteError);
    assert.equal(err.deadLettered, true);
    assert.match(err.remoteMessage, /unknown operation/);
  });

  test("a timeout is bounded: a job that keeps failing ends the call with no_reply", async () => {
    const err = await expectCode(c.call(uniq("poison"), "fail", { timeout: 300 }), "no_reply");
    assert.ok(err instanceof NoReplyError);
  });

  test("refusals: bad key, bad id, reserved header, payload too large", async () => {
    await expectCode(c.call("", "get"), "bad_key");
    await expectCode(c.submit(" padded", "get"), "bad_key");
    await expectCode(c.submit("a\u0007b", "get"), "bad_key");
    await expectCode(c.submit("x".repeat(1025), "get"), "bad_key");
    await expectCode(c.submit("sku", "get", { id: "a..b" }), "bad_job_id");
    await expectCode(c.submit("sku", "get", { id: "" }), "bad_job_id");
    await expectCode(c.submit("sku", "get", { headers: { "Nats-Rollup": "sub" } }), "reserved_header");
    await expectCode(c.submit("sku", "get", { headers: { "X-Ok": " padded" } }), "bad_header");
    const max = c.nc.info!.max_payload;
    await expectCode(c.submit("sku", new Uint8Array(max)), "payload_too_large");
    await expectCode(c.call("sku", new Uint8Array(max - 1000)), "payload_too_large");
  });

  test("a key at its backlog cap: key_backlog_full, nothing stored", { skip: capNamespace ? false : "KEYLANE_CAP_NAMESPACE not set" }, async () => {
    // The harness's cap namespace: MaxKeyBacklog 2 and no worker, so a
    // key's jobs stay queued.
    const k = await Client.open(c.nc, { namespace: capNamespace });
    try {
      assert.equal(k.info.maxKeyBacklog, 2);
      const key = uniq("hot");
      const queuedId = uniq("queued");
      // On a capped namespace every job is a batch of one on its key's
      // subject, where the server counts it against the cap.
      const s = await sniff(c.nc, `${capNamespace}.jobs.>`);
      await k.submit(key, "buy 1", { id: queuedId });
      const generated = await k.submit(key, "buy 1");
      s.stop();
      const seen = once(s.msgs.map(seenBatch));
      const p = partitionOf(key, k.partitions);
      assert.deepEqual(seen.map((b) => b.subject), [`${capNamespace}.jobs.${p}.${keyToken(key)}`, `${capNamespace}.jobs.${p}.${keyToken(key)}`]);
      for (const b of seen) {
        assert.ok(validBatchID(b.batchID), `batch ID ${b.batchID}`);
        assert.equal(b.header("Keylane-Batch"), "1");
        assert.equal(b.header("Keylane-Batch-Jobs"), "1");
        assert.equal(b.header("Keylane-Key"), undefined);
        assert.equal(b.jobs.length, 1);
      }
      // A caller's ID stays, flagged idempotent; a generated one is the batch's.
      assert.deepEqual([seen[0].jobs[0].id, seen[0].jobs[0].idempotent], [queuedId, true]);
      assert.deepEqual([seen[1].jobs[0].id, seen[1].jobs[0].idempotent], [`${seen[1].batchID}.0`, false]);
      assert.equal(generated, `${seen[1].batchID}.0`);
      const full = await expectCode(k.submit(key, "buy 1"), "key_backlog_full");
      assert.ok(full instanceof KeyBacklogFullError && full.cap === 2 && full.key === key);
      await expectCode(k.call(key, "buy 1", { timeout: 5000 }), "key_backlog_full");
      // A job with the caller's ID is "full" only once the key's queue
      // is read and does not hold it (nor is an outcome kept).
      await expectCode(k.submit(key, "buy 1", { id: uniq("order") }), "key_backlog_full");
      await expectCode(k.call(key, "buy 1", { id: uniq("order"), timeout: 5000 }), "key_backlog_full");
      // The queued job's ID again: stored before, nothing new.
      await expectCode(k.submit(key, "buy 1", { id: queuedId }), "duplicate");
      // The harness stored order-q on queued:1 (full) with the Go client
      // (a batch of one: its job ID in the body) and waited until the
      // server forgot the ID: a retry is refused over the cap, yet the
      // job is stored. Not "full": submit says duplicate, and a call waits
      // for the job's outcome (no worker runs here: no_reply, bounded).
      await expectCode(k.submit("queued:1", "buy 1", { id: "order-q" }), "duplicate");
      await expectCode(k.call("queued:1", "buy 1", { id: "order-q", timeout: 1500 }), "no_reply");
      // A call on the capped namespace is a batch of one on its key's
      // subject too, its reply in the body.
      const cs = await sniff(c.nc, `${capNamespace}.jobs.>`);
      const callID = uniq("order");
      try {
        await expectCode(k.call(uniq("cold"), "buy 1", { id: callID, timeout: 1500 }), "no_reply");
      } finally {
        cs.stop();
      }
      const calls = once(cs.msgs.map(seenBatch));
      assert.equal(calls.length, 1);
      assert.equal(calls[0].subject.split(".").pop(), keyToken(calls[0].jobs[0].key));
      assert.ok(calls[0].jobs[0].id === callID && calls[0].jobs[0].keepOutcome && calls[0].jobs[0].idempotent && calls[0].jobs[0].reply !== "");
      await expectCode(k.submit("queued:1", "buy 1", { id: uniq("order") }), "key_backlog_full");
      // Other keys are not affected.
      await k.submit(uniq("cold"), "buy 1");
    } finally {
      await k.close();
    }
  });

  test("a job too large for a batch of several goes as a batch of one, up to max_payload", { skip: bigURL && bigNamespace ? false : "KEYLANE_BIG_URL not set" }, async () => {
    // The harness's big server: max_payload 12 MiB, above the wire's 8
    // MiB on a batch of several; its worker answers the payload's length.
    const b = await connect({ servers: bigURL, namespace: bigNamespace });
    const s = await sniff(b.nc, `${bigNamespace}.jobs.>`);
    try {
      const nine = 9 << 20;
      const key = uniq("big");
      const id = await b.submit(key, new Uint8Array(nine), { timeout: 30000 });
      assert.ok(id.length > 0);
      assert.equal(text(await b.call(key, new Uint8Array(nine), { timeout: 30000 })), String(nine));
      // Over max_payload as a batch of one: refused before anything is sent.
      const max = b.nc.info!.max_payload;
      await expectCode(b.submit(key, new Uint8Array(max - 200)), "payload_too_large");
      await b.nc.flush();
      // Every message a batch; the two 9 MiB jobs each a batch of one over 8 MiB.
      assert.deepEqual(s.msgs.filter((m) => !m.subject.endsWith(".batch")).map((m) => m.subject), []);
      const seen = once(batchesOf(s.msgs, key));
      assert.equal(seen.length, 2);
      for (const sb of seen) {
        assert.equal(sb.jobs.length, 1);
        assert.ok(sb.body.length / 2 > 8 << 20, `a batch of one of ${sb.body.length / 2} bytes`);
      }
    } finally {
      s.stop();
      await b.close();
    }
  });

  test("a publish the server refuses ends with refused, not the timeout", { skip: permURL ? false : "KEYLANE_PERM_URL not set" }, async () => {
    // The harness's second server: this user may not publish jobs of
    // namespace "perm"; the server says so asynchronously, and no stream
    // ack ever comes. Without the refusal read, both would wait 20s and
    // end with unknown_outcome and no_reply.
    const p = await connect({ servers: permURL, namespace: "perm", nats: { user: process.env.KEYLANE_PERM_USER, pass: process.env.KEYLANE_PERM_PASS } });
    try {
      const e1 = await expectCode(p.submit(uniq("k"), "buy 1", { timeout: 20000 }), "refused");
      assert.match(e1.message, /Permissions Violation/i);
      await expectCode(p.call(uniq("k"), "buy 1", { timeout: 20000 }), "refused");
    } finally {
      await p.close();
    }
  });

  test("an application's own connection from another copy of the NATS packages: a refused publish ends with refused at once", { skip: permURL ? false : "KEYLANE_PERM_URL not set" }, async () => {
    // The application connected with its own @nats-io/transport-node,
    // another version than the client's (nats-other, an alias of
    // 3.0.2 with its own nats-core): its errors are instances of other
    // classes than the client's. Before, the client recognised the
    // refusal with instanceof against its own copy, missed it, and both
    // waited the whole timeout: unknown_outcome and no_reply.
    const nc = await otherConnect({ servers: permURL, user: process.env.KEYLANE_PERM_USER, pass: process.env.KEYLANE_PERM_PASS });
    try {
      const p = await Client.open(nc as unknown as NatsConnection, { namespace: "perm" });
      const started = Date.now();
      const e1 = await expectCode(p.submit(uniq("k"), "buy 1", { timeout: 15000 }), "refused");
      assert.match(e1.message, /Permissions Violation/i);
      await expectCode(p.call(uniq("k"), "buy 1", { timeout: 15000 }), "refused");
      const took = Date.now() - started;
      assert.ok(took < 5000, `refused after ${took} ms: the refusal was waited out`);
      await p.close();
    } finally {
      await nc.close();
    }
  });

  test("a job the worker holds ends the call with held, at once", { skip: heldNamespace ? false : "KEYLANE_HELD_NAMESPACE not set" }, async () => {
    // The harness re-created this namespace's jobs stream under a worker:
    // key "k"'s state carries the old stream's epoch, so the worker holds
    // the job (stored, not run) until an operator adopts that epoch.
    const h = await Client.open(c.nc, { namespace: heldNamespace });
    try {
      const id = uniq("held");
      const err = await expectCode(h.call("k", "x", { id, timeout: 20000 }), "held");
      assert.ok(err instanceof HeldError);
      assert.equal(err.jobId, id);
      assert.equal(err.epoch, true);
      assert.match(err.reason, /another jobs stream/);
    } finally {
      await h.close();
    }
  });

  test("a namespace that is not set up is refused with no_topology", async () => {
    await expectCode(connect({ servers: url, namespace: uniq("nosuch") }), "no_topology");
  });

  test("a namespace that is not one, or whose objects are another's, is refused at once", async () => {
    // Names are lower case: "Shop" is no namespace (its objects would be shop's).
    await expectCode(Client.open(c.nc, { namespace: namespace!.toUpperCase() }), "bad_namespace");
    await expectCode(Client.open(c.nc, { namespace: "x.y" }), "bad_namespace");
    // "rv_x" and "rv-x" share object names: a jobs stream RV_X_JOBS of
    // rv_x's subjects is not rv-x's. Before, open took it and every
    // submit waited out its timeout (no responders on rv-x.jobs.*).
    const jsm = await jetstreamManager(c.nc);
    const other = `rv_${process.pid}`;
    const name = `${other.toUpperCase()}_JOBS`;
    await jsm.streams.add({
      name,
      subjects: [`${other}.jobs.0.*`],
      metadata: { "keylane.partitions": "1", "keylane.hash": "xxhash64-mod", "keylane.version": "4" },
    });
    try {
      const err = await expectCode(Client.open(c.nc, { namespace: other.replace("_", "-") }), "no_topology");
      assert.match(err.message, /another namespace/);
      const own = await Client.open(c.nc, { namespace: other });
      await own.close();
    } finally {
      await jsm.streams.delete(name);
    }
  });

  test("streams.json: each vector's streams, made on the server, opened as the Go client opened them", async () => {
    // PROTOCOL.md § 2: every rule of opening a namespace, each a vector
    // the Go client opened on a real server (TestConformanceVectors).
    const file = JSON.parse(readFileSync(new URL("../../../../testdata/conformance/streams.json", import.meta.url), "utf8"));
    assert.ok(file.vectors.length > 0);
    const codeOf: Record<string, string> = {
      ErrNoTopology: "no_topology",
      ErrPartitionMismatch: "partition_mismatch",
      ErrOldJobsStream: "old_jobs_stream",
      ErrShardsMismatch: "shards_mismatch",
      ErrMaxDeliverMismatch: "max_deliver_mismatch",
    };
    const jsm = await jetstreamManager(c.nc);
    const wrong: string[] = [];
    for (const v of file.vectors) {
      for (const sc of v.streams) await jsm.streams.add({ ...sc, storage: "memory" });
      try {
        let got: unknown;
        try {
          const o = await Client.open(c.nc, { namespace: v.namespace, partitions: v.client_partitions });
          const i = o.info;
          await o.close();
          got = {
            accepted: true,
            settings: {
              partitions: i.partitions,
              shards: i.shards,
              reply_prefix: i.replyPrefix,
              max_key_backlog: i.maxKeyBacklog,
              delays: i.delays,
              jobs_streams: Array.from({ length: i.shards }, (_, k) => new Names(v.namespace).jobsShard(k)),
            },
          };
        } catch (err) {
          got = { accepted: false, code: err instanceof KeylaneError ? err.code : String(err), message: (err as Error).message };
        }
        const want = v.accepted ? { accepted: true, settings: v.settings } : { accepted: false, code: codeOf[v.go_error] ?? v.go_error };
        const g = got as { message?: string };
        const { message: _m, ...cmp } = g;
        try {
          assert.deepEqual(cmp, want);
        } catch {
          wrong.push(`${v.name}: opened as ${JSON.stringify(got)}, Go: ${JSON.stringify(want)} (${v.error})`);
        }
      } finally {
        for (const sc of v.streams) await jsm.streams.delete(sc.name);
      }
    }
    assert.deepEqual(wrong, []);
  });

  test("a full stream (10077, not a key's cap) is refused at once, never published again until the timeout", async () => {
    // A namespace whose one jobs stream holds at most one message
    // (DiscardNew): the second job is refused "maximum messages
    // exceeded", 503 and 10077 like a key at its cap, but it lasts until
    // jobs are removed (PROTOCOL.md § 7, class limit).
    const ns = `full${process.pid}`;
    const name = new Names(ns).jobs();
    const jsm = await jetstreamManager(c.nc);
    await jsm.streams.add({
      name,
      subjects: [`${ns}.jobs.0.*`],
      retention: "workqueue" as never,
      discard: "new" as never,
      storage: "memory" as never,
      max_msgs: 1,
      metadata: { "keylane.partitions": "1", "keylane.hash": "xxhash64-mod", "keylane.version": "4" },
    });
    const f = await Client.open(c.nc, { namespace: ns });
    try {
      await f.submit("k", "buy 1");
      const s = await sniff(c.nc, `${ns}.jobs.>`);
      const started = Date.now();
      try {
        const e = await expectCode(f.submit("k", "buy 1", { timeout: 10000 }), "refused");
        assert.match(e.message, /maximum messages exceeded/);
        await expectCode(f.call("k", "buy 1", { timeout: 10000 }), "refused");
        // The refusal can come back before the server's copy of the
        // publish reaches the sniffer (a stream on one replica answers
        // inline): a round trip after it brings every copy the server
        // sent before it.
        await c.nc.flush();
      } finally {
        s.stop();
      }
      assert.ok(Date.now() - started < 5000, `refused after ${Date.now() - started} ms`);
      assert.equal(s.msgs.length, 2, "each published once");
    } finally {
      await f.close();
      await jsm.streams.delete(name);
    }
  });

  test("a partition count other than the namespace's is refused", async () => {
    await expectCode(Client.open(c.nc, { namespace, partitions: c.partitions + 1 }), "partition_mismatch");
  });

  test("a short first read does not bound every later read of the results bucket", async () => {
    // A TCP proxy to the server that delays what the server sends once
    // slow is set: a real connection getting slower, not a mock.
    const target = new URL(url!.split(",")[0]);
    let slow = 0;
    const proxy = createServer((down) => {
      const up = tcpConnect(Number(target.port), target.hostname);
      down.on("data", (b) => up.write(b));
      up.on("data", (b) => {
        if (slow === 0) down.write(b);
        else setTimeout(() => down.destroyed || down.write(b), slow);
      });
      const end = () => {
        up.destroy();
        down.destroy();
      };
      down.on("error", end).on("close", end);
      up.on("error", end).on("close", end);
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    const c2 = await connect({ servers: `nats://127.0.0.1:${(proxy.address() as AddressInfo).port}`, namespace });
    try {
      const sku = uniq("sku");
      const id = uniq("order");
      assert.equal(text(await c2.call(sku, "set 4", { id })), "ok 4");
      // The first read of the bucket, with little time left: none kept.
      await expectCode(c2.result(uniq("never"), { timeout: 400 }), "no_result");
      // The server now answers in 800 ms: a read given 10 s finds the
      // outcome. Before, the bucket was opened with the first read's
      // 400 ms as its request timeout, and every later read timed out.
      slow = 800;
      assert.equal(text(await c2.result(id, { timeout: 10000 })), "ok 4");
    } finally {
      slow = 0;
      await c2.close();
      proxy.close();
    }
  });

  test("submitMany: a partition's jobs in batch messages of at most 256, every job stored and applied once, in order", async () => {
    const skus = [uniq("sku"), uniq("sku"), uniq("sku")];
    for (const sku of skus) await c.call(sku, "set 300");
    const s = await sniff(c.nc, `${namespace}.jobs.>`);
    const jobs = Array.from({ length: 600 }, (_, i) => ({ key: skus[i % 3], payload: "buy 1", ...(i % 10 === 0 ? { id: uniq("order") } : {}) }));
    let out: Awaited<ReturnType<Client["submitMany"]>>;
    try {
      out = await c.submitMany(jobs);
    } finally {
      s.stop();
    }
    assert.equal(out.length, 600);
    out.forEach((o, i) => {
      assert.equal(o.error, undefined, `job ${i}: ${o.error?.message}`);
      if (jobs[i].id) assert.equal(o.id, jobs[i].id);
      else assert.match(o.id, /^[A-Za-z0-9]{22}\.[0-9]+$/);
    });
    assert.equal(new Set(out.map((o) => o.id)).size, 600, "600 distinct job IDs");
    // Nothing on the keys' own subjects; each batch one partition's, at
    // most 256 jobs, a generated ID its batch's and index's.
    assert.deepEqual(s.msgs.filter((m) => !m.subject.endsWith(".batch")).map((m) => m.subject), []);
    const seen = once(s.msgs.map(seenBatch));
    const sent: string[] = [];
    for (const b of seen) {
      assert.ok(b.jobs.length >= 1 && b.jobs.length <= 256, `a batch of ${b.jobs.length}`);
      assert.equal(b.header("Keylane-Batch-Jobs"), String(b.jobs.length));
      b.jobs.forEach((j, k) => {
        assert.equal(b.subject, `${namespace}.jobs.${partitionOf(j.key, c.partitions)}.batch`);
        if (!j.idempotent) assert.equal(j.id, `${b.batchID}.${k}`);
        sent.push(j.id);
      });
    }
    assert.deepEqual([...sent].sort(), out.map((o) => o.id).sort(), "every job sent once, under the ID submitMany answered");
    const perPartition = new Map<number, number>();
    for (const j of jobs) perPartition.set(partitionOf(j.key, c.partitions), (perPartition.get(partitionOf(j.key, c.partitions)) ?? 0) + 1);
    const want = [...perPartition.values()].reduce((n, jobsOf) => n + Math.ceil(jobsOf / 256), 0);
    assert.equal(seen.length, want, `600 jobs of ${perPartition.size} partition(s) in full batches of at most 256`);
    for (const sku of skus) assert.equal(text(await c.call(sku, "get")), "stock 100");
    // A caller's ID: its outcome kept by ID.
    assert.match(text(await c.result(jobs[0].id!, { timeout: 5000 })), /^sold [0-9]+$/);

    // A key's jobs in the order given, a bad one refused alone, a
    // caller's ID given twice stored twice and applied once.
    const k = uniq("sku");
    const twice = uniq("order");
    const mixed = await c.submitMany([
      { key: k, payload: "set 50" },
      { key: "", payload: "buy 1" },
      { key: k, payload: "buy 1", id: twice },
      { key: k, payload: "buy 2" },
      { key: k, payload: "buy 1", id: twice },
      { key: k, payload: "buy 1", id: "bad..id" },
    ]);
    assert.deepEqual(mixed.map((o) => o.error?.code), [undefined, "bad_key", undefined, undefined, undefined, "bad_job_id"]);
    assert.equal(mixed[2].id, twice);
    assert.equal(text(await c.call(k, "get")), "stock 47");
  });

  test("submitMany on a namespace with a key backlog cap: batches of one on the key's subject, the key's third job refused alone", { skip: capNamespace ? false : "KEYLANE_CAP_NAMESPACE not set" }, async () => {
    const k = await Client.open(c.nc, { namespace: capNamespace });
    try {
      const key = uniq("hot");
      const s = await sniff(c.nc, `${capNamespace}.jobs.>`);
      const out = await k.submitMany([1, 2, 3].map((n) => ({ key, payload: `buy ${n}` })));
      s.stop();
      assert.deepEqual(out.map((o) => o.error?.code), [undefined, undefined, "key_backlog_full"]);
      const seen = once(s.msgs.map(seenBatch));
      assert.deepEqual(seen.map((b) => b.subject.split(".").pop()), [keyToken(key), keyToken(key), keyToken(key)]);
      assert.deepEqual(seen.map((b) => b.jobs.length), [1, 1, 1]);
      assert.deepEqual(seen.map((b) => b.jobs[0].id), out.map((o) => o.id));
      assert.deepEqual(seen.map((b) => `${b.batchID}.0`), out.map((o) => o.id));
    } finally {
      await k.close();
    }
  });

  test("an AbortSignal fired before: AbortError, nothing sent", async () => {
    const ac = new AbortController();
    ac.abort(new Error("the order was cancelled"));
    const sku = uniq("sku");
    const s = await sniff(c.nc, `${namespace}.jobs.>`);
    try {
      for (const p of [c.call(sku, "buy 1", { signal: ac.signal }), c.submit(sku, "buy 1", { signal: ac.signal, id: uniq("order") }), c.result(uniq("order"), { signal: ac.signal })]) {
        const err = await expectCode(p, "aborted");
        assert.ok(err instanceof AbortedError);
        assert.equal(err.name, "AbortError");
        assert.equal(err.sent, false);
        assert.match(String((err.cause as Error).message), /cancelled/);
      }
      const many = await c.submitMany([{ key: sku, payload: "buy 1" }, { key: sku, payload: "buy 2" }], { signal: ac.signal });
      assert.deepEqual(many.map((o) => [o.error?.code, (o.error as AbortedError).sent]), [["aborted", false], ["aborted", false]]);
      await c.nc.flush();
    } finally {
      s.stop();
    }
    assert.deepEqual(s.msgs.filter((m) => batchesOf([m], sku).length > 0), []);
  });

  test("an AbortSignal fired while waiting ends the call and the submit at once", { skip: capNamespace ? false : "KEYLANE_CAP_NAMESPACE not set" }, async () => {
    // The cap namespace has no worker: a call waits for ever (here its
    // 20 s timeout, no_reply) unless its signal ends it.
    const k = await Client.open(c.nc, { namespace: capNamespace });
    try {
      const ac = new AbortController();
      const started = Date.now();
      setTimeout(() => ac.abort(), 300);
      const err = await expectCode(k.call(uniq("hot"), "buy 1", { id: uniq("order"), timeout: 20000, signal: ac.signal }), "aborted");
      assert.ok(err instanceof AbortedError && err.sent, "sent: stored or not, unknown");
      assert.ok(Date.now() - started < 5000, `aborted after ${Date.now() - started} ms`);
    } finally {
      await k.close();
    }
    // A submit whose stream acks are lost: aborted mid-wait; the same id
    // again stores nothing new, and it is applied once.
    const sku = uniq("sku");
    await c.call(sku, "set 10");
    const priv = c as unknown as { lostAcks: number };
    const id = uniq("order");
    const ac = new AbortController();
    try {
      priv.lostAcks = 1000;
      setTimeout(() => ac.abort(), 300);
      const err = await expectCode(c.submit(sku, "buy 1", { id, timeout: 20000, signal: ac.signal }), "aborted");
      assert.ok(err instanceof AbortedError && err.sent && err.jobId === id);
    } finally {
      priv.lostAcks = 0;
    }
    assert.equal(await c.submit(sku, "buy 1", { id }), id);
    assert.equal(text(await c.call(sku, "get")), "stock 9");
  });

  test("delayed jobs: on the delay subject with Keylane-Run-At, run when due and not before, after the key's jobs that came first", { skip: delayNamespace ? false : "KEYLANE_DELAY_NAMESPACE not set" }, async () => {
    const d = await Client.open(c.nc, { namespace: delayNamespace });
    try {
      assert.equal(d.info.delays, true);
      type Ran = { key: string; got: { n: number }; at: number };
      const ranAt = async (id: string): Promise<Ran> => {
        const until = Date.now() + 30000;
        for (;;) {
          try {
            return JSON.parse(text(await d.result(id, { timeout: 2000 }))) as Ran;
          } catch (err) {
            assert.ok(err instanceof KeylaneError && err.code === "no_result", String(err));
            assert.ok(Date.now() < until, `job ${id} did not run in 30 s`);
            await new Promise((r) => setTimeout(r, 100));
          }
        }
      };
      const key = uniq("doc");
      const id = `order.${uniq("d")}`; // a dot: "~" in its subject
      const runAt = new Date(Date.now() + 2000);
      const s = await sniff(c.nc, `${delayNamespace}.>`);
      try {
        assert.equal(await d.submitJSON(key, { n: 1 }, { id, runAt }), id);
        // A job of the same key submitted now runs first.
        const now = uniq("now");
        await d.submitJSON(key, { n: 2 }, { id: now });
        const first = await ranAt(now);
        await expectCode(d.result(id), "no_result");
        const late = await ranAt(id);
        assert.deepEqual(late.got, { n: 1 });
        assert.ok(late.at >= runAt.getTime(), `ran at ${late.at}, before its run-at ${runAt.getTime()}`);
        assert.ok(first.at < late.at);
      } finally {
        s.stop();
      }
      // A batch of one on the ID's delay subject, the run-at on the message.
      const sub = once(s.msgs.filter((m) => m.subject.includes(".delay.")).map(seenBatch));
      assert.equal(sub.length, 1, "one submission on the delay subject");
      const m = sub[0];
      assert.equal(m.subject, `${delayNamespace}.delay.${partitionOf(key, d.partitions)}.${id.replaceAll(".", "~")}`);
      assert.equal(m.header("Keylane-Run-At"), formatRunAt(runAt));
      assert.match(formatRunAt(runAt), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$/);
      assert.ok(validBatchID(m.batchID), `batch ID ${m.batchID}`);
      assert.equal(m.header("Keylane-Batch"), "1");
      assert.equal(m.header("Keylane-Batch-Jobs"), "1");
      assert.equal(m.header("Keylane-Key"), undefined);
      assert.equal(m.header("Keylane-Reply"), undefined);
      assert.equal(m.jobs.length, 1);
      assert.deepEqual([m.jobs[0].id, m.jobs[0].key, m.jobs[0].idempotent, m.jobs[0].keepOutcome, m.jobs[0].reply], [id, key, true, false, ""]);

      // delay (ms from now), and a generated ID (its batch's: <batch ID>.0);
      // submitMany sends a delayed job alone, the others in batches.
      const before = Date.now();
      const gs = await sniff(c.nc, `${delayNamespace}.delay.>`);
      const gen = await d.submit(uniq("doc"), JSON.stringify({ n: 3 }), { delay: 1500 });
      gs.stop();
      assert.match(gen, /^[A-Za-z0-9]{22}\.0$/);
      const gm = once(gs.msgs.map(seenBatch));
      assert.deepEqual(gm.map((b) => [b.subject.split(".").pop(), b.jobs[0].id, b.jobs[0].idempotent]), [[gen.replace(".", "~"), gen, false]]);
      assert.equal(gen, `${gm[0].batchID}.0`);
      const many = await d.submitMany([
        { key, payload: JSON.stringify({ n: 4 }), id: uniq("m"), delay: 1500 },
        { key, payload: JSON.stringify({ n: 5 }), id: uniq("m") },
      ]);
      assert.deepEqual(many.map((o) => o.error), [undefined, undefined]);
      const [m4, m5] = [await ranAt(many[0].id), await ranAt(many[1].id)];
      assert.ok(m4.at >= before + 1500 && m5.at < m4.at, `delayed ran at ${m4.at - before} ms, the other at ${m5.at - before} ms`);
      // A run-at a little in the past (within a second) runs at once.
      const soon = uniq("soon");
      await d.submit(key, JSON.stringify({ n: 6 }), { id: soon, runAt: new Date(Date.now() - 300) });
      await ranAt(soon);

      // Refused before anything is sent.
      await expectCode(d.submit(key, "x", { delay: -1 }), "bad_delay");
      await expectCode(d.submit(key, "x", { delay: 31 * 24 * 3600 * 1000 }), "bad_delay");
      await expectCode(d.submit(key, "x", { runAt: new Date(Date.now() - 5000) }), "bad_delay");
      await expectCode(d.submit(key, "x", { runAt: new Date(Number.NaN) }), "bad_delay");
      await expectCode(d.call(key, "x", { delay: 1000 }), "delayed_call");
      // A namespace made without delays.
      const off = await expectCode(c.submit(uniq("sku"), "buy 1", { delay: 1000 }), "delays_off");
      assert.doesNotMatch(off.message, /TopologyConfig|WithDelay|Setup/);
    } finally {
      await d.close();
    }
  });

  test("after close, calls reject with closed", async () => {
    const c2 = await Client.open(c.nc, { namespace });
    await c2.close();
    await expectCode(c2.call(uniq("sku"), "get"), "closed");
  });
});
