// The gateway's price against the TypeScript client on one mesh, robust to a shared machine: per
// system, sequential p50 (300 calls), then a fixed number of calls at 32 in flight whose CPU is
// counted for every process over those calls only (no idle windows, unlike the suite's loops).
// Usage: node bench/gateway-cost.mjs [COMPARE_ROOT]  (CALLS=3000 ROUNDS=2; `npm run build` first)
// COMPARE_ROOT: another built checkout whose gateway runs as M+gateway-before.
import { performance } from "node:perf_hooks";
import { cpuSeconds, sequential } from "./lib/measure.mjs";
import { payloadOf, startMesh } from "./lib/systems.mjs";
const root = process.argv[2];
const CALLS = Number(process.env.CALLS ?? 3000);
const p = payloadOf(1024);
const systems = [
  ["M", await startMesh({})],
  ["M+gateway", await startMesh({ name: "M+gateway", gateway: true })],
  ...(root
    ? [["M+gateway-before", await startMesh({ name: "M+gateway-before", gateway: true, root })]]
    : []),
];
for (const [, s] of systems) await sequential(s.call, 300, p);
for (let r = 0; r < Number(process.env.ROUNDS ?? 2); r++) {
  let base;
  for (const [name, s] of systems) {
    const seq = await sequential(s.call, 300, p);
    const pids = s.pids();
    const before = Object.fromEntries(Object.entries(pids).map(([k, v]) => [k, cpuSeconds(v)]));
    const t0 = performance.now();
    let n = 0;
    await Promise.all(
      Array.from({ length: 32 }, async () => {
        while (n++ < CALLS) await s.call(p);
      }),
    );
    const wall = (performance.now() - t0) / 1000;
    const cpu = Object.fromEntries(
      Object.entries(pids).map(([k, v]) => [
        k,
        Math.round(((cpuSeconds(v) - before[k]) * 1e6) / CALLS),
      ]),
    );
    const total = Object.values(cpu).reduce((a, b) => a + b, 0);
    const rate = Math.round(CALLS / wall);
    base ??= { seq: seq.p50_ms, rate, total };
    const vs = `+${(seq.p50_ms - base.seq).toFixed(2)} ms, ${(rate / base.rate).toFixed(2)}x throughput, ${(total / base.total).toFixed(2)}x CPU`;
    console.log(
      name.padEnd(17),
      `seq p50 ${seq.p50_ms} ms, ${rate}/s, cpu ${total} µs/call (vs M: ${vs})`,
      JSON.stringify(cpu),
    );
  }
}
for (const [, s] of systems) await s.stop();
process.exit(0);
