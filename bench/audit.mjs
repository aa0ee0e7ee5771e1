// The call path with the audit trail (TOOLMESH_AUDIT=required) against without it, in one run:
// `node bench/audit.mjs [--smoke] [--out DIR] [--cpu-prof DIR]` (the JSON line is also written to
// DIR/audit.json; --cpu-prof writes each service's CPU profile under DIR/off and DIR/on).
//
// Two meshes (resolver, executor, echo), one recording every call in the tenant's audit stream,
// one not, both warmed up first. Phases alternate in pairs (4, or 2 with --smoke), in the order
// off-on then on-off; each measures sequential calls (p50) and a closed loop of 64 in flight
// (throughput), once the events of the phase before are written. The ratios printed are the
// medians of the pairs' (one noisy phase moves one pair, not the result). Prints one JSON line;
// aim: throughput ≥ 0.85 of off, p50 at most 0.3 ms more.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { jetstreamManager } from "@nats-io/jetstream";
import { createSubjects } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import { closedLoop, fastest, median, phase, round } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    out: { type: "string" },
    "cpu-prof": { type: "string" },
  },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);
const SEQUENTIAL = flags.smoke ? 300 : 2_000;
const LOOP_MS = flags.smoke ? 3_000 : 10_000;
const payload = { text: "x".repeat(64) };

const profiled = (side) =>
  flags["cpu-prof"] ? ["--cpu-prof", `--cpu-prof-dir=${join(flags["cpu-prof"], side)}`] : [];
const off = await startMesh({ name: "audit-off", nodeArgs: profiled("off") });
const on = await startMesh({
  name: "audit-on",
  nodeArgs: profiled("on"),
  env: { TOOLMESH_AUDIT: "required" },
  // The audit stream `toolmesh setup --tenants default` makes for the bench's tenant.
  prepare: async (nc) =>
    ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(createSubjects(), "default")),
});

/** Waits until the audit stream stops growing: the events of the phase before are written. */
async function written(jsm) {
  const stream = createSubjects().auditStream("default");
  let last = -1;
  for (;;) {
    const { messages } = (await jsm.streams.info(stream)).state;
    if (messages === last) return messages;
    last = messages;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

const PAIRS = flags.smoke ? 2 : 4;
const results = { off: [], on: [] };
const pairs = [];
let events;
try {
  const jsm = await jetstreamManager(on.nc);
  for (const mesh of [off, on])
    await closedLoop(mesh.call, { inFlight: 64, durationMs: 2_000, payload });
  for (let pair = 0; pair < PAIRS; pair++) {
    const measured = {};
    for (const side of pair % 2 === 0 ? ["off", "on"] : ["on", "off"]) {
      await written(jsm);
      const mesh = side === "on" ? on : off;
      measured[side] = await phase((p) => mesh.call(p), {
        label: side,
        sequentialCalls: SEQUENTIAL,
        loopMs: LOOP_MS,
        payload,
        log,
        system: mesh,
      });
      results[side].push(measured[side]);
    }
    pairs.push({
      throughput: measured.on.calls_per_s / measured.off.calls_per_s,
      p50_added_ms: measured.on.p50_ms - measured.off.p50_ms,
    });
  }
  events = await written(jsm);
  log(`audit events written: ${events}`);
} finally {
  await Promise.all([off.stop(), on.stop()]);
}
const summary = (side) => ({
  p50_ms: round(median(results[side].map((r) => r.p50_ms))),
  calls_per_s: round(median(results[side].map((r) => r.calls_per_s))),
  cpu_us_by_process: fastest(results[side]).cpu_us_by_process,
  server_msgs_per_call: fastest(results[side]).server_msgs_per_call,
});
const line = JSON.stringify({
  bench: "audit",
  pairs: PAIRS,
  throughput_ratio: round(median(pairs.map((p) => p.throughput))),
  p50_added_ms: round(median(pairs.map((p) => p.p50_added_ms))),
  pair_throughput_ratios: pairs.map((p) => round(p.throughput)),
  pair_p50_added_ms: pairs.map((p) => round(p.p50_added_ms)),
  off: summary("off"),
  on: summary("on"),
});
console.log(line);
if (flags.out !== undefined) {
  mkdirSync(flags.out, { recursive: true });
  writeFileSync(join(flags.out, "audit.json"), `${line}\n`);
}
