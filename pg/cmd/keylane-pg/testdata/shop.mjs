// A Node service that sells from PostgreSQL with no Go code: it calls
// keylane-pg's job types of example/shop.json through @keylane/client
// (keylane-pg's e2e test, TestNodeSellsFromPostgres, runs it against a
// real NATS server, keylane-pg processes and a real PostgreSQL).
//
// It stocks SKUS with START units each (type "restock"), then BUYERS
// concurrent buyers make PURCHASES one-unit purchases each (type "buy"),
// on SKUs drawn in turn, each under its own order ID, the job's ID
// (calling again with the same ID after no reply). Then it buys again
// with RETRIES of the order IDs that sold and RETRIES that did not (a customer's retry: answered from the
// record, never sold twice), sends two bad jobs (a payload without its
// field, a type the file lacks), and reads each SKU's stock (type
// "stock"). Every answer is one JSON line on stdout.

import { connect, KeylaneError } from "@keylane/client";

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} not set`);
  return v;
};
const c = await connect({ servers: env("KEYLANE_NATS_URL"), namespace: env("KEYLANE_NAMESPACE") });
const skus = env("SKUS").split(",");
const start = Number(env("START"));
const buyers = Number(env("BUYERS"));
const purchases = Number(env("PURCHASES"));
const retries = Number(env("RETRIES"));
const out = (line) => process.stdout.write(JSON.stringify(line) + "\n");

for (const sku of skus) {
  out({ restock: sku, result: await c.callJSON(sku, { n: start }, { type: "restock" }) });
}

// buy calls "buy" with the order ID as the job's ID; after no reply it
// calls again with the same ID.
async function buy(sku, id) {
  let line = { id, sku, error: "no attempt" };
  for (let attempt = 0; attempt < 5; attempt++) {
    try {
      return { id, sku, result: await c.callJSON(sku, { qty: 1 }, { id, type: "buy", timeout: 10000 }) };
    } catch (err) {
      line = { id, sku, error: String(err) };
      if (!(err instanceof KeylaneError && err.code === "no_reply")) break;
    }
  }
  return line;
}

const answers = [];
await Promise.all(
  Array.from({ length: buyers }, async (_, b) => {
    for (let n = 0; n < purchases; n++) {
      const a = await buy(skus[(b + n) % skus.length], `order-${b}-${n}`);
      answers.push(a);
      out(a);
    }
  }),
);

// RETRIES orders that sold and RETRIES that found the SKU sold out.
const again = [
  ...answers.filter((a) => a.result?.sold === true).slice(0, retries),
  ...answers.filter((a) => a.result?.sold === false).slice(0, retries),
];
for (const a of again) {
  out({ retry: true, ...(await buy(a.sku, a.id)) });
}

for (const [what, payload, type] of [
  ["missing field", {}, "buy"],
  ["unknown type", { qty: 1 }, "sell"],
]) {
  try {
    const r = await c.callJSON(skus[0], payload, { type, timeout: 10000 });
    out({ bad: what, result: r });
  } catch (err) {
    out({ bad: what, error: String(err), permanent: err.permanent === true });
  }
}

for (const sku of skus) {
  out({ stock: sku, result: await c.callJSON(sku, {}, { type: "stock" }) });
}
await c.close();
