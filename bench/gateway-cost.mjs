// The gateway's price against the TypeScript client on one mesh, robust to a shared machine: per
// system, sequential p50 (300 calls), then a fixed number of calls at 32 in flight whose CPU is
// counted for every process over those calls only (no idle windows, unlike the suite's loops).
// Each gateway is driven twice: by TypeScript MCP SDK clients (`M+gateway`, what agent frameworks
// use) and by a minimal JSON-RPC client over kept-alive HTTP (`M+gateway-http`), whose own cost is
// small, so the gateway's price shows apart from the SDK client's. The driver's CPU is the load
// client's.
// Usage: node bench/gateway-cost.mjs [--compare-root DIR]  (CALLS=3000 ROUNDS=2; `npm run build` first)
// --compare-root: another built checkout whose gateway runs as M+gateway-before (and -http-before).
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { cpuSeconds, sequential } from "./lib/measure.mjs";
import { payloadOf, startMesh } from "./lib/systems.mjs";
const { values: flags, positionals } = parseArgs({
  options: { "compare-root": { type: "string" } },
  allowPositionals: true,
});
const root = flags["compare-root"] ?? positionals[0];
const CALLS = Number(process.env.CALLS ?? 3000);
const p = payloadOf(1024);
const mesh = await startMesh({});
const gateway = await startMesh({ name: "M+gateway", gateway: true });
const before = root && (await startMesh({ name: "M+gateway-before", gateway: true, root }));
const systems = [
  ["M", mesh, mesh.call],
  ["M+gateway", gateway, gateway.call],
  ["M+gateway-http", gateway, gateway.callHttp],
  ...(before
    ? [
        ["M+gateway-before", before, before.call],
        ["M+gateway-http-before", before, before.callHttp],
      ]
    : []),
];
for (const [, , call] of systems) await sequential(call, 300, p);
const rows = new Map(systems.map(([name]) => [name, []]));
for (let r = 0; r < Number(process.env.ROUNDS ?? 2); r++) {
  let base;
  for (const [name, s, call] of systems) {
    const seq = await sequential(call, 300, p);
    const pids = s.pids();
    const cpuBefore = Object.fromEntries(Object.entries(pids).map(([k, v]) => [k, cpuSeconds(v)]));
    const t0 = performance.now();
    let n = 0;
    await Promise.all(
      Array.from({ length: 32 }, async () => {
        while (n++ < CALLS) await call(p);
      }),
    );
    const wall = (performance.now() - t0) / 1000;
    const cpu = Object.fromEntries(
      Object.entries(pids).map(([k, v]) => [
        k,
        Math.round(((cpuSeconds(v) - cpuBefore[k]) * 1e6) / CALLS),
      ]),
    );
    const total = Object.values(cpu).reduce((a, b) => a + b, 0);
    const rate = Math.round(CALLS / wall);
    base ??= { seq: seq.p50_ms, rate, total };
    rows.get(name).push({
      delta: seq.p50_ms - base.seq,
      ratio: rate / base.rate,
      cpu: total,
      cpuRatio: total / base.total,
      server: cpu["nats-server"],
    });
    const vs = `+${(seq.p50_ms - base.seq).toFixed(2)} ms, ${(rate / base.rate).toFixed(2)}x throughput, ${(total / base.total).toFixed(2)}x CPU`;
    console.log(
      name.padEnd(21),
      `seq p50 ${seq.p50_ms} ms, ${rate}/s, cpu ${total} µs/call (vs M: ${vs})`,
      JSON.stringify(cpu),
    );
  }
}
// Each figure's median over the rounds, each round's taken against M of the same round.
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log("median over rounds, each against M of its round:");
for (const [name, xs] of rows) {
  const m = (f) => median(xs.map(f));
  console.log(
    name.padEnd(21),
    `p50 +${m((x) => x.delta).toFixed(2)} ms, ${m((x) => x.ratio).toFixed(2)}x throughput,`,
    `cpu ${m((x) => x.cpu)} µs/call (${m((x) => x.cpuRatio).toFixed(2)}x), nats-server ${m((x) => x.server)} µs/call`,
  );
}
for (const s of [mesh, gateway, before].filter(Boolean)) await s.stop();
process.exit(0);
