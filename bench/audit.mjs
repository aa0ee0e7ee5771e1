// The call path with the audit trail (TOOLMESH_AUDIT=required) against without it, in one run:
// `node bench/audit.mjs [--smoke] [--out DIR]` (the JSON line is also written to DIR/audit.json).
//
// Two meshes (resolver, executor, echo), one recording every call in the tenant's audit stream,
// one not. Phases alternate between them (off, on, off, on); each measures sequential calls
// (p50) and a closed loop of 64 in flight (throughput). Prints one JSON line with both sides and
// the ratios; aim: throughput ≥ 0.85 of off, p50 at most 0.3 ms more.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { jetstreamManager } from "@nats-io/jetstream";
import { createSubjects } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import { fastest, phase, round } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const { values: flags } = parseArgs({
  options: { smoke: { type: "boolean", default: false }, out: { type: "string" } },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);
const SEQUENTIAL = flags.smoke ? 300 : 2_000;
const LOOP_MS = flags.smoke ? 3_000 : 10_000;
const payload = { text: "x".repeat(64) };

const off = await startMesh({ name: "audit-off" });
const on = await startMesh({
  name: "audit-on",
  env: { TOOLMESH_AUDIT: "required" },
  // The audit stream `toolmesh setup --tenants default` makes for the bench's tenant.
  prepare: async (nc) =>
    ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(createSubjects(), "default")),
});

const results = { off: [], on: [] };
try {
  for (const side of ["off", "on", "off", "on"]) {
    const mesh = side === "on" ? on : off;
    results[side].push(
      await phase((p) => mesh.call(p), {
        label: side,
        sequentialCalls: SEQUENTIAL,
        loopMs: LOOP_MS,
        payload,
        log,
        system: mesh,
      }),
    );
  }
  const info = await (
    await jetstreamManager(on.nc)
  ).streams.info(createSubjects().auditStream("default"));
  log(`audit events written: ${info.state.messages}`);
} finally {
  await Promise.all([off.stop(), on.stop()]);
}
const best = (side, key, pick) => pick(...results[side].map((r) => r[key]));
const summary = (side) => ({
  p50_ms: best(side, "p50_ms", Math.min),
  calls_per_s: best(side, "calls_per_s", Math.max),
  cpu_us_by_process: fastest(results[side]).cpu_us_by_process,
});
const [a, b] = [summary("off"), summary("on")];
const line = JSON.stringify({
  bench: "audit",
  off: a,
  on: b,
  throughput_ratio: round(b.calls_per_s / a.calls_per_s),
  p50_added_ms: round(b.p50_ms - a.p50_ms),
});
console.log(line);
if (flags.out !== undefined) {
  mkdirSync(flags.out, { recursive: true });
  writeFileSync(join(flags.out, "audit.json"), `${line}\n`);
}
