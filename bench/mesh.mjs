// End-to-end benchmark: a nats-server of its own, a resolver and an executor as separate
// processes, and a client submitting `echo` calls: one at a time (latency) and many in flight
// (throughput). Prints one JSON line per scenario. Noisy on shared cores: compare ratios of
// runs made back to back on the same machine.
import { spawn } from "node:child_process";
import { createHistogram, performance } from "node:perf_hooks";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import { startNatsServer } from "@toolmesh/nats-launcher";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const SEQUENTIAL = Number(process.env.BENCH_SEQUENTIAL ?? 1_000);
const PARALLEL = Number(process.env.BENCH_PARALLEL ?? 5_000);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 64);

function service(name, env) {
  const child = spawn(process.execPath, [join(ROOT, "services", name, "dist", "main.js")], {
    env: { PATH: process.env.PATH, TOOLMESH_LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "ignore", "inherit"],
  });
  return child;
}

const server = await startNatsServer();
const env = {
  NATS_URL: server.url,
  TOOLMESH_TOOLS_DIR: join(ROOT, "tools", "builtin"),
  TOOLMESH_CONCURRENCY: "64",
};
const children = [service("resolver", env), service("executor", env)];
const nc = await connect({ servers: server.url, noAsyncTraces: true });
const client = new ToolmeshClient(nc, { defaultTimeoutMs: 30_000 });

try {
  // Ready when a call goes through.
  const warm = client.session("bench-warm");
  for (let i = 0; ; i++) {
    const m = await warm.submit(
      { id: `w${i}`, name: "echo", arguments: { text: "hi" } },
      { timeoutMs: 2_000 },
    ).result;
    if (m.error === undefined) break;
  }
  for (let i = 0; i < 200; i++)
    await warm.submit({ id: `x${i}`, name: "echo", arguments: { text: "hi" } }).result;
  warm.close();

  const sequential = client.session("bench-seq");
  const latency = createHistogram();
  let started = performance.now();
  for (let i = 0; i < SEQUENTIAL; i++) {
    const t0 = performance.now();
    const m = await sequential.submit({ id: `s${i}`, name: "echo", arguments: { text: "hi" } })
      .result;
    if (m.error !== undefined) throw new Error(`${m.error.code}: ${m.error.message}`);
    latency.record(Math.max(1, Math.round((performance.now() - t0) * 1000)));
  }
  let elapsed = performance.now() - started;
  sequential.close();
  console.log(
    JSON.stringify({
      bench: "mesh-sequential",
      calls: SEQUENTIAL,
      p50_ms: latency.percentile(50) / 1000,
      p99_ms: latency.percentile(99) / 1000,
      calls_per_s: Math.round(SEQUENTIAL / (elapsed / 1000)),
    }),
  );

  // Many in flight, spread over sessions (each resolver enforces a per-session limit).
  const sessions = Array.from({ length: 8 }, (_, i) => client.session(`bench-par-${i}`));
  const inFlight = createHistogram();
  let next = 0;
  started = performance.now();
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (next < PARALLEL) {
        const i = next++;
        const t0 = performance.now();
        const m = await sessions[i % sessions.length].submit({
          id: `p${i}`,
          name: "echo",
          arguments: { text: "hi" },
        }).result;
        if (m.error !== undefined) throw new Error(`${m.error.code}: ${m.error.message}`);
        inFlight.record(Math.max(1, Math.round((performance.now() - t0) * 1000)));
      }
    }),
  );
  elapsed = performance.now() - started;
  for (const s of sessions) s.close();
  console.log(
    JSON.stringify({
      bench: "mesh-parallel",
      calls: PARALLEL,
      in_flight: IN_FLIGHT,
      p50_ms: inFlight.percentile(50) / 1000,
      p99_ms: inFlight.percentile(99) / 1000,
      calls_per_s: Math.round(PARALLEL / (elapsed / 1000)),
      client_heap_mb: Math.round(process.memoryUsage().heapUsed / 2 ** 20),
    }),
  );
} finally {
  await nc.close();
  for (const c of children) c.kill("SIGTERM");
  await server.stop();
}
