// encodebatch reads batches as JSON on stdin and prints, as JSON, the batch
// message this client builds for each: the client's own path (buildJob's
// checks, batchJobOf, buildBatch), so that batch_test.go can compare it
// with wire.EncodeBatch and wire.Rules.ParseBatch. Input: an array of
// { namespace, partitions, shards, reply_prefix, partition, batch_id,
// jobs: [{ key, id, explicit, type, reply, call, headers, payload_hex }] };
// output: an array of { subject, headers, body_hex } or { error }.

import { batchJobOf, buildBatch, buildJob, type JobInput } from "@keylane/client";

interface In {
  namespace: string;
  partitions: number;
  shards: number;
  reply_prefix: string;
  partition: number;
  batch_id: string;
  jobs: Array<{ key: string; id: string; explicit: boolean; type: string; reply: string; call: boolean; headers: Record<string, string[]>; payload_hex: string }>;
}

const chunks: Buffer[] = [];
for await (const c of process.stdin) chunks.push(c as Buffer);
const batches = JSON.parse(Buffer.concat(chunks).toString("utf8")) as In[];
const out = batches.map((b) => {
  try {
    const ns = { namespace: b.namespace, partitions: b.partitions, shards: b.shards, replyPrefix: b.reply_prefix };
    const jobs = b.jobs.map((j) => {
      const input: JobInput = {
        key: j.key,
        payload: new Uint8Array(Buffer.from(j.payload_hex, "hex")),
        id: j.id,
        explicit: j.explicit,
        type: j.type,
        headers: j.headers,
        reply: j.reply === "" ? undefined : j.reply,
        call: j.call,
      };
      buildJob(ns, input, 8 << 20);
      return batchJobOf(input);
    });
    const m = buildBatch(ns, b.partition, b.batch_id, jobs);
    const headers: Record<string, string[]> = {};
    for (const [k, v] of m.headers) (headers[k] ??= []).push(v);
    return { subject: m.subject, headers, body_hex: Buffer.from(m.body).toString("hex") };
  } catch (err) {
    return { error: String(err) };
  }
});
process.stdout.write(JSON.stringify(out));
