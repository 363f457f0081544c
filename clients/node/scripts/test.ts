// npm test: the conformance vectors, and the server suite against a real
// nats-server and real Go workers. Those are started by the Go test of
// this folder (node_test.go: an in-process nats-server, keylane's
// workers), which runs the suite with KEYLANE_NATS_URL and
// KEYLANE_NAMESPACE set; so this runs `go test` here, and with those
// set (the Go test's own run) node's test runner directly.
//
// Without Go the server suite cannot start. Outside CI this says so
// loudly and runs the conformance vectors alone; under CI (CI set) it
// fails: a green run must never mean a suite that did not run.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const run = (cmd: string, args: string[]): number => {
  const r = spawnSync(cmd, args, { cwd: pkg, stdio: "inherit" });
  if (r.error) {
    console.error(`npm test: ${cmd}: ${r.error.message}`);
    return 1;
  }
  return r.status ?? 1;
};

function main(): number {
  if (process.env.KEYLANE_NATS_URL && process.env.KEYLANE_NAMESPACE) {
    return run(process.execPath, ["--test", "dist/test/client.test.js", "dist/test/conformance.test.js"]);
  }
  const go = spawnSync("go", ["version"], { encoding: "utf8" });
  const haveGo = !go.error && go.status === 0;
  const inRepo = existsSync(join(pkg, "..", "..", "go.mod"));
  if (haveGo && inRepo) {
    // The Go test builds this package again, starts the server and the
    // workers, and runs the suite and the mixed Node and Go sales.
    return run("go", ["test", "-count=1", "-timeout", "15m", "-run", "^Test(Node|README)", "."]);
  }
  const why = !inRepo
    ? "this is not a checkout of the keylane repository (its Go workers start from there)"
    : `no go on the PATH (${go.error?.message ?? go.stderr.trim()}): the server suite starts a nats-server and keylane's Go workers with \`go test\``;
  if (process.env.CI) {
    console.error(`npm test: CI=${process.env.CI} and the server suite cannot run: ${why}. Install Go (https://go.dev/dl/), or run the repository's scripts/test.`);
    return 1;
  }
  console.error(`npm test: SKIPPING the server suite: ${why}. Only the conformance vectors run.`);
  return run(process.execPath, ["--test", "dist/test/conformance.test.js"]);
}

process.exitCode = main();
