// Large arguments and results through the mesh, in one run:
// `node bench/large-payloads.mjs [--smoke] [--bytes N] [--compare-root DIR] [--out DIR]`
// (after `npm run build`).
//
// A closed loop of IN_FLIGHT `echo` calls whose argument is `--bytes` characters (default
// 500 KB), echoed back as the result: every call moves that much into the calls stream, to the
// executor and back through the sessions stream and the call records. Reports, per side, calls
// per second and the CPU per call (user + system) of each process: the driver (the calling
// client), nats-server, the resolver and the executor. With `--compare-root` (another built
// checkout with its own node_modules, e.g. a git worktree of main), its services run as side
// "before" and this checkout's as "after", in rounds of ABBA order; each side's figures are the
// medians of its rounds. Writes large-payloads.json to --out (default bench/results/).
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { ToolmeshClient } from "@toolmesh/client";
import { costPerCall, median, round, snapshot } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    bytes: { type: "string", default: String(500 * 1024) },
    "compare-root": { type: "string" },
    out: { type: "string", default: join(HERE, "results") },
  },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);

const BYTES = Number(flags.bytes);
const IN_FLIGHT = 4;
const WARM_UP = 30;
const CALLS = flags.smoke ? 100 : 300;
const ROUNDS = flags.smoke ? 1 : 2;

/** One side's round: a mesh of `root`'s services, a warm-up, then CALLS calls measured. */
async function measure(name, root) {
  const mesh = await startMesh({
    name: `large-${name}`,
    concurrency: 64,
    ...(root === undefined ? {} : { root }),
    // Room for every result of the round: the figures are of calls, not of storage bounds.
    env: { TOOLMESH_STORE_BYTES: String(4 * 1024 ** 3) },
  });
  try {
    const client = new ToolmeshClient(mesh.nc, { tenant: "large" });
    const sessions = Array.from({ length: IN_FLIGHT }, (_, i) => client.session(`large-${i}`));
    const text = "x".repeat(BYTES);
    let next = 0;
    const loop = async (until) => {
      while (next < until) {
        const i = next++;
        const m = await sessions[i % IN_FLIGHT].submit(
          { id: `${name}-${i}`, name: "echo", arguments: { text } },
          { timeoutMs: 60_000 },
        ).result;
        if (m.error !== undefined) throw new Error(`${m.error.code}: ${m.error.message}`);
      }
    };
    const run = (until) => Promise.all(Array.from({ length: IN_FLIGHT }, () => loop(until)));
    await run(WARM_UP);
    const before = await snapshot(mesh);
    const startedAt = performance.now();
    await run(WARM_UP + CALLS);
    const seconds = (performance.now() - startedAt) / 1000;
    const cost = costPerCall(before, await snapshot(mesh), CALLS);
    for (const s of sessions) s.close();
    return { calls_per_s: round(CALLS / seconds, 1), cpu_us_by_process: cost.cpu_us_by_process };
  } finally {
    await mesh.stop();
  }
}

/** The medians of one side's rounds. */
function medians(rounds) {
  const roles = Object.keys(rounds[0].cpu_us_by_process);
  return {
    calls_per_s: round(median(rounds.map((r) => r.calls_per_s)), 1),
    cpu_us_by_process: Object.fromEntries(
      roles.map((role) => [role, round(median(rounds.map((r) => r.cpu_us_by_process[role])), 1)]),
    ),
  };
}

const sides = flags["compare-root"] === undefined ? ["after"] : ["before", "after"];
const rounds = Object.fromEntries(sides.map((s) => [s, []]));
for (let r = 0; r < ROUNDS; r++) {
  for (const side of r % 2 === 0 ? sides : [...sides].reverse()) {
    const figures = await measure(side, side === "before" ? flags["compare-root"] : undefined);
    log(`${side}: ${JSON.stringify(figures)}`);
    rounds[side].push(figures);
  }
}
const result = {
  setup: { bytes: BYTES, in_flight: IN_FLIGHT, calls: CALLS, rounds: ROUNDS },
  ...Object.fromEntries(sides.map((s) => [s, { ...medians(rounds[s]), rounds: rounds[s] }])),
};
mkdirSync(flags.out, { recursive: true });
writeFileSync(join(flags.out, "large-payloads.json"), `${JSON.stringify(result, null, 2)}\n`);
log(JSON.stringify(Object.fromEntries(sides.map((s) => [s, medians(rounds[s])]))));
