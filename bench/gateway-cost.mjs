// The gateway's price against the TypeScript client on one mesh, robust to a shared machine: the
// systems take turns in short slices (the order rotating), so a change of the machine's load
// falls on all of them alike. Per slice and system: sequential calls (their latencies merged into
// one histogram per system), then a fixed number of calls at 32 in flight whose wall time and CPU
// (every process of the system, counted over those calls only) are summed per system.
// Each gateway is driven twice in each MCP era (2025-11-25 sessions, and 2026-07-28 as `-2026`):
// by TypeScript MCP SDK v2 clients (`M+gateway`, what agent frameworks use) and by a minimal
// JSON-RPC client over kept-alive HTTP (`M+gateway-http`), whose own cost is
// small, so the gateway's price shows apart from the SDK client's. The driver's CPU is the load
// client's.
// Usage: node bench/gateway-cost.mjs [--compare-root DIR]  (`npm run build` first)
//   CALLS=3000 calls at 32 in flight and SEQ=300 sequential calls per system, in SLICES=10 turns.
// --compare-root: another built checkout whose gateway runs as M+gateway-before (and -http-before).
// --mesh-limits: also a gateway counting per-credential limits mesh-wide (TOOLMESH_GATEWAY_LIMITS=mesh),
//   driven by the JSON-RPC client in both eras as M+gateway-http-mesh-limits (and -2026).
import { performance } from "node:perf_hooks";
import { benchFlags } from "./lib/flags.mjs";
import { cpuSeconds, newHistogram, sequential, summarize } from "./lib/measure.mjs";
import { payloadOf, startMesh } from "./lib/systems.mjs";
const { values: flags, positionals } = benchFlags({
  options: { "compare-root": { type: "string" }, "mesh-limits": { type: "boolean" } },
  allowPositionals: true,
});
const root = flags["compare-root"] ?? positionals[0];
const SLICES = Number(process.env.SLICES ?? 10);
const CALLS = Math.ceil(Number(process.env.CALLS ?? 3000) / SLICES);
const SEQ = Math.ceil(Number(process.env.SEQ ?? 300) / SLICES);
const p = payloadOf(1024);
const mesh = await startMesh({});
const gateway = await startMesh({ name: "M+gateway", gateway: true });
const before = root && (await startMesh({ name: "M+gateway-before", gateway: true, root }));
const meshLimits =
  flags["mesh-limits"] === true &&
  (await startMesh({
    name: "M+gateway-mesh-limits",
    gateway: true,
    env: { TOOLMESH_GATEWAY_LIMITS: "mesh" },
  }));
const systems = [
  ["M", mesh, mesh.call],
  ["M+gateway", gateway, gateway.call],
  ["M+gateway-http", gateway, gateway.callHttp],
  // The same gateway in MCP 2026-07-28 (no initialize, the envelope in every request's _meta).
  ...(gateway.modern()
    ? [
        ["M+gateway-2026", gateway, gateway.callModern],
        ["M+gateway-http-2026", gateway, gateway.callHttpModern],
      ]
    : []),
  ...(meshLimits
    ? [
        ["M+gateway-http-mesh-limits", meshLimits, meshLimits.callHttp],
        ["M+gateway-http-2026-mesh-limits", meshLimits, meshLimits.callHttpModern],
      ]
    : []),
  ...(before
    ? [
        ["M+gateway-before", before, before.call],
        ["M+gateway-http-before", before, before.callHttp],
      ]
    : []),
].map(([name, s, call]) => ({ name, s, call, hist: newHistogram(), wall: 0, cpu: {}, calls: 0 }));
for (const { call } of systems) await sequential(call, 300, p);
for (let slice = 0; slice < SLICES; slice++) {
  for (let i = 0; i < systems.length; i++) {
    const system = systems[(i + slice) % systems.length];
    const { s, call } = system;
    system.hist.add((await sequential(call, SEQ, p)).hist);
    const pids = s.pids();
    const cpuBefore = Object.fromEntries(Object.entries(pids).map(([k, v]) => [k, cpuSeconds(v)]));
    const t0 = performance.now();
    let n = 0;
    await Promise.all(
      Array.from({ length: 32 }, async () => {
        while (n++ < CALLS) await call(p);
      }),
    );
    system.wall += (performance.now() - t0) / 1000;
    system.calls += CALLS;
    for (const [k, v] of Object.entries(pids))
      system.cpu[k] = (system.cpu[k] ?? 0) + cpuSeconds(v) - cpuBefore[k];
  }
}
let base;
for (const { name, hist, wall, cpu, calls } of systems) {
  const p50 = summarize(hist).p50_ms;
  const rate = Math.round(calls / wall);
  const perCall = Object.fromEntries(
    Object.entries(cpu).map(([k, v]) => [k, Math.round((v * 1e6) / calls)]),
  );
  const total = Object.values(perCall).reduce((a, b) => a + b, 0);
  base ??= { p50, rate, total };
  const vs = `+${(p50 - base.p50).toFixed(2)} ms, ${(rate / base.rate).toFixed(2)}x throughput, ${(total / base.total).toFixed(2)}x CPU`;
  console.log(
    name.padEnd(21),
    `seq p50 ${p50} ms, ${rate}/s, cpu ${total} µs/call (vs M: ${vs})`,
    JSON.stringify(perCall),
  );
}
for (const s of [mesh, gateway, before, meshLimits].filter(Boolean)) await s.stop();
process.exit(0);
