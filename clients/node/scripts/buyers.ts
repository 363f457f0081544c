// Node buyers for the mixed run (clients/node/node_test.go,
// TestNodeAndGoBuyers): BUYERS concurrent buyers each make PURCHASES calls
// "buy 1" on SKUs drawn in turn from SKUS, each with its own job ID
// (PREFIX-<buyer>-<n>), calling again with the same ID after no reply.
// Once connected it prints {"ready":true} and waits for a line on its
// standard input, so the Go buyers start at the same moment. Every
// answered purchase is printed as one JSON line {"id","sku","result"}; an
// unanswered one as {"id","sku","error"}.

import { createInterface } from "node:readline";
import { connect, KeylaneError } from "@keylane/client";

const env = (k: string): string => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} not set`);
  return v;
};

// RECONNECT_WAIT (ms) is how long the connection waits between
// reconnect attempts (nats.js's default, 2000, when unset).
const reconnectTimeWait = process.env.RECONNECT_WAIT ? Number(process.env.RECONNECT_WAIT) : undefined;
const c = await connect({ servers: env("KEYLANE_NATS_URL"), namespace: env("KEYLANE_NAMESPACE"), nats: { reconnectTimeWait } });
const skus = env("SKUS").split(",");
const buyers = Number(env("BUYERS"));
const purchases = Number(env("PURCHASES"));
const prefix = env("PREFIX");

process.stdout.write(JSON.stringify({ ready: true }) + "\n");
const lines = createInterface({ input: process.stdin });
await new Promise<void>((resolve) => lines.once("line", () => resolve()));
lines.close();

async function buyer(b: number): Promise<void> {
  for (let n = 0; n < purchases; n++) {
    const sku = skus[(b + n) % skus.length];
    const id = `${prefix}-${b}-${n}`;
    let line: Record<string, string> = { id, sku, error: "no attempt" };
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const res = await c.call(sku, "buy 1", { id, timeout: 10000 });
        line = { id, sku, result: Buffer.from(res).toString("utf8") };
        break;
      } catch (err) {
        line = { id, sku, error: String(err) };
        if (!(err instanceof KeylaneError && err.code === "no_reply")) break;
      }
    }
    process.stdout.write(JSON.stringify(line) + "\n");
  }
}

await Promise.all(Array.from({ length: buyers }, (_, b) => buyer(b)));
await c.close();
