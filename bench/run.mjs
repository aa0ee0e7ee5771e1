// toolmesh benchmark suite: `npm run bench` (full, several minutes) or `npm run bench -- --smoke`
// (under 2 minutes; CI runs it and it fails only on a large regression, judged by ratios to the
// baselines measured in the same run). Writes a JSON result, a Markdown report and latency CDF
// charts (SVG) to `--out` (default bench/results/). See CONTRIBUTING.md, "Benchmarks".
// `--systems M,M+gateway` runs only those systems; `--compare-root DIR` adds M-before,
// M+gateway-before and M+gateway-http-before, the services built in another checkout, for
// before/after figures of one run.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtempSync, rmSync, writeFileSync as writeFile } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { fileURLToPath } from "node:url";
import { setTimeout as delay } from "node:timers/promises";
import { performance } from "node:perf_hooks";
import { spawn } from "node:child_process";
import {
  closedLoop,
  costPerCall,
  newHistogram,
  openLoop,
  round,
  rssBytes,
  sequential,
  snapshot,
  summarize,
  varz,
} from "./lib/measure.mjs";
import {
  payloadOf,
  startBullMq,
  startMesh,
  startRawJetStream,
  startRawNats,
} from "./lib/systems.mjs";
import { checkThresholds, writeReport } from "./lib/report.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    out: { type: "string", default: join(HERE, "results") },
    rounds: { type: "string" },
    redis: { type: "string", default: "127.0.0.1:6379" },
    "no-redis": { type: "boolean", default: false },
    // Extra environment for a "metrics on" variant of the mesh, e.g. TOOLMESH_METRICS_PORT=0.
    "metrics-env": { type: "string", multiple: true, default: [] },
    // Extra environment for the services of system M, e.g. TOOLMESH_STREAM_COMPRESSION=none, to
    // compare a setting by running the suite once with it and once without.
    "mesh-env": { type: "string", multiple: true, default: [] },
    // Another built checkout (e.g. a git worktree of main) whose services run as "M-before".
    "compare-root": { type: "string" },
    // Only these systems, comma-separated (e.g. `--systems M,M+gateway`); default: all of the mode.
    systems: { type: "string" },
  },
});
const only = flags.systems === undefined ? undefined : new Set(flags.systems.split(","));
const wanted = (name) => only === undefined || only.has(name);

const smoke = flags.smoke;
const plan = smoke
  ? { rounds: 2, seq: 200, closedMs: 2_000, openMs: 2_000, rate: 1_000, inFlight: 64 }
  : { rounds: 3, seq: 500, closedMs: 4_000, openMs: 4_000, rate: 1_000, inFlight: 64 };
if (flags.rounds !== undefined) plan.rounds = Number(flags.rounds);
const PAYLOAD = payloadOf(1024);
const SIZES = smoke ? [] : [100, 10 * 1024, 100 * 1024];
const MEMORY_IN_FLIGHT = smoke ? 0 : 10_000;
const SETTLE_MS = 1_000;
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);

const startedAt = new Date();
const result = {
  started_at: startedAt.toISOString(),
  mode: smoke ? "smoke" : "full",
  plan,
  machine: { node: process.version, cpus: (await import("node:os")).cpus().length },
  systems: {},
  extras: {},
};

// ---- start every system once ----
const systems = [];
const start = async (label, fn) => {
  if (!wanted(label)) return undefined;
  log(`starting ${label}`);
  const t0 = performance.now();
  const s = await fn();
  log(`  ${label} ready in ${Math.round(performance.now() - t0)} ms`);
  systems.push(s);
  return s;
};
try {
  await start("R", startRawNats);
  await start("J", startRawJetStream);
  if (!flags["no-redis"]) {
    await start("B", () => startBullMq({ redis: flags.redis })).catch((err) => {
      log(`  B skipped: ${err.message}`);
      result.extras.bullmq_skipped = err.message;
    });
  }
  const meshEnv = Object.fromEntries(flags["mesh-env"].map((kv) => kv.split(/=(.*)/s).slice(0, 2)));
  const mesh = await start("M", () =>
    startMesh({
      title: `toolmesh (1 executor, no tracing${flags["mesh-env"].map((kv) => `, ${kv}`).join("")})`,
      env: meshEnv,
    }),
  );
  // The MCP front door: the same calls from MCP clients through the gateway (Streamable HTTP).
  await start("M+gateway", () =>
    startMesh({
      name: "M+gateway",
      title: "toolmesh through the MCP gateway (TypeScript MCP SDK clients)",
      gateway: true,
    }),
  );
  // The same from a minimal JSON-RPC client: the gateway's price without the SDK client's.
  await start("M+gateway-http", () =>
    throughHttp({
      name: "M+gateway-http",
      title: "toolmesh through the MCP gateway (minimal JSON-RPC client over HTTP)",
    }),
  );
  if (!smoke) {
    await start("M+trace", () =>
      startMesh({
        name: "M+trace",
        title: "toolmesh, tracing on (OTLP to a local sink)",
        tracing: true,
      }),
    );
    await start("M+2x", () =>
      startMesh({ name: "M+2x", title: "toolmesh, two executors", executors: 2 }),
    );
  }
  if (flags["compare-root"] !== undefined) {
    await start("M-before", () =>
      startMesh({
        name: "M-before",
        title: `toolmesh built in ${flags["compare-root"]}`,
        root: flags["compare-root"],
      }),
    );
    await start("M+gateway-before", () =>
      startMesh({
        name: "M+gateway-before",
        title: `toolmesh through the MCP gateway built in ${flags["compare-root"]}`,
        gateway: true,
        root: flags["compare-root"],
      }),
    );
    await start("M+gateway-http-before", () =>
      throughHttp({
        name: "M+gateway-http-before",
        title: `toolmesh through the MCP gateway built in ${flags["compare-root"]} (minimal JSON-RPC client)`,
        root: flags["compare-root"],
      }),
    );
  }
  if (flags["metrics-env"].length > 0) {
    const env = Object.fromEntries(
      flags["metrics-env"].map((kv) => kv.split(/=(.*)/s).slice(0, 2)),
    );
    await start("M+metrics", () =>
      startMesh({
        name: "M+metrics",
        title: `toolmesh, tracing and metrics on (${flags["metrics-env"].join(" ")})`,
        tracing: true,
        env,
      }),
    );
  }

  // ---- warm up every system ----
  for (const s of systems) await sequential(s.call, 200, PAYLOAD);

  // ---- alternating rounds ----
  const acc = new Map(
    systems.map((s) => [
      s.name,
      { seq: newHistogram(), closed: newHistogram(), open: newHistogram(), rounds: [] },
    ]),
  );
  for (let r = 0; r < plan.rounds; r++) {
    // Rotate the order so no system always runs right after the same one.
    const order = systems.map((_, i) => systems[(i + r) % systems.length]);
    for (const s of order) {
      log(`round ${r + 1}/${plan.rounds}: ${s.name}`);
      const a = acc.get(s.name);
      const seq = await sequential(s.call, plan.seq, PAYLOAD);
      a.seq.add(seq.hist);
      // Counted between quiet moments, once the last acknowledgements are in.
      await delay(SETTLE_MS);
      let before = await snapshot(s);
      const closed = await closedLoop(s.call, {
        inFlight: plan.inFlight,
        durationMs: plan.closedMs,
        payload: PAYLOAD,
      });
      await delay(SETTLE_MS);
      let after = await snapshot(s);
      const closedCost = costPerCall(before, after, closed.calls);
      a.closed.add(closed.hist);
      before = await snapshot(s);
      const open = await openLoop(s.call, {
        rate: plan.rate,
        durationMs: plan.openMs,
        payload: PAYLOAD,
      });
      after = await snapshot(s);
      const openCost = costPerCall(before, after, open.calls);
      a.open.add(open.hist);
      const sizes = {};
      for (const size of SIZES) {
        sizes[size] = strip(await sequential(s.call, 100, payloadOf(size)));
      }
      a.rounds.push({
        sequential: strip(seq),
        closed: { ...strip(closed), ...closedCost },
        open: { ...strip(open), ...openCost },
        ...(SIZES.length > 0 ? { payload_sizes: sizes } : {}),
      });
    }
  }
  for (const s of systems) {
    const a = acc.get(s.name);
    const median = (f) => {
      const xs = a.rounds
        .map(f)
        .filter((x) => x !== undefined)
        .sort((x, y) => x - y);
      return xs.length === 0 ? undefined : xs[Math.floor(xs.length / 2)];
    };
    const sizes = {};
    for (const size of SIZES)
      sizes[size] = {
        p50_ms: median((x) => x.payload_sizes[size].p50_ms),
        p99_ms: median((x) => x.payload_sizes[size].p99_ms),
      };
    result.systems[s.name] = {
      title: s.title,
      sequential: summarize(a.seq),
      closed: {
        ...summarize(a.closed),
        calls_per_s: median((x) => x.closed.calls_per_s),
        in_flight: plan.inFlight,
      },
      open: {
        ...summarize(a.open),
        rate: plan.rate,
        timeouts: a.rounds.reduce((n, x) => n + x.open.timeouts + x.open.errors, 0),
      },
      // Per completed call, at full load (the closed loop): an open loop the system cannot keep
      // up with leaves calls unfinished in its window.
      cost: {
        cpu_us_per_call: median((x) => x.closed.cpu_us_per_call),
        open_cpu_us_per_call: median((x) => x.open.cpu_us_per_call),
        cpu_us_by_process: a.rounds.at(-1).closed.cpu_us_by_process,
        server_in_msgs_per_call: median((x) => x.closed.server_in_msgs_per_call),
        server_out_msgs_per_call: median((x) => x.closed.server_out_msgs_per_call),
      },
      ...(SIZES.length > 0 ? { payload_sizes: sizes } : {}),
      rounds: a.rounds,
    };
  }

  // ---- extras on the mesh ----
  if (mesh !== undefined) {
    log("idle mesh: server messages");
    // Longer than a pull request's expiry (30 s) in the full run, so renewed pulls show.
    const seconds = smoke ? 5 : 35;
    const v0 = await varz(mesh.monitorUrl);
    await delay(seconds * 1_000);
    const v1 = await varz(mesh.monitorUrl);
    result.extras.idle_mesh = {
      seconds,
      in_msgs_per_s: round((v1.in_msgs - v0.in_msgs) / seconds, 2),
      out_msgs_per_s: round((v1.out_msgs - v0.out_msgs) / seconds, 2),
    };
  }
  if (!smoke && mesh !== undefined) {
    // A failing extra is reported, not fatal: the rounds' results are worth keeping.
    const extra = async (key, fn) => {
      try {
        result.extras[key] = await fn();
      } catch (err) {
        log(`${key} failed: ${err.message}`);
        result.extras[key] = { error: err.message };
      }
    };
    await extra("first_call", () => firstCallToNewTool(mesh));
    await extra("schema_expansion", schemaExpansion);
    await extra("memory", () => memoryPerInFlightCall(MEMORY_IN_FLIGHT));
  }
} finally {
  for (const s of systems.reverse()) {
    const extra = await s.stop().catch((err) => ({ stop_error: String(err) }));
    if (extra && result.systems[s.name] !== undefined) Object.assign(result.systems[s.name], extra);
  }
}

result.finished_at = new Date().toISOString();
result.ratios = ratios(result.systems);
mkdirSync(flags.out, { recursive: true });
const stamp = startedAt.toISOString().replace(/[:.]/g, "-");
const jsonPath = join(flags.out, `bench-${result.mode}-${stamp}.json`);
writeFileSync(jsonPath, `${JSON.stringify(result, null, 2)}\n`);
const mdPath = writeReport(result, flags.out, stamp);
log(`wrote ${jsonPath}\nwrote ${mdPath}`);
process.stdout.write(`${JSON.stringify({ mode: result.mode, ratios: result.ratios })}\n`);
if (smoke) {
  const thresholds = JSON.parse(readFileSync(join(HERE, "thresholds.json"), "utf8"));
  const failures = checkThresholds(result, thresholds);
  for (const f of failures) log(`REGRESSION: ${f}`);
  if (failures.length > 0) process.exit(1);
  log("smoke: within thresholds");
}
process.exit(0);

/** A mesh behind the gateway whose calls come from the minimal JSON-RPC client. */
async function throughHttp(options) {
  const system = await startMesh({ ...options, gateway: true });
  return { ...system, call: system.callHttp };
}

/** A summary without its histogram and CDF points. */
function strip(summary) {
  return Object.fromEntries(Object.entries(summary).filter(([k]) => k !== "hist" && k !== "cdf"));
}

/** The mesh relative to each baseline, and each mesh variant relative to the mesh. */
function ratios(s) {
  const out = {};
  const m = s.M;
  if (m === undefined) return out;
  for (const base of ["R", "B", "J"]) {
    const b = s[base];
    if (b === undefined) continue;
    out[`M_vs_${base}`] = {
      sequential_p50: round(m.sequential.p50_ms / b.sequential.p50_ms, 2),
      throughput: round(m.closed.calls_per_s / b.closed.calls_per_s, 2),
      open_p99: round(m.open.p99_ms / b.open.p99_ms, 2),
      cpu_per_call: round(m.cost.cpu_us_per_call / b.cost.cpu_us_per_call, 2),
    };
  }
  for (const v of Object.keys(s).filter((k) => k.startsWith("M+") || k === "M-before")) {
    out[`${v}_vs_M`] = {
      sequential_p50: round(s[v].sequential.p50_ms / m.sequential.p50_ms, 2),
      throughput: round(s[v].closed.calls_per_s / m.closed.calls_per_s, 2),
      cpu_per_call: round(s[v].cost.cpu_us_per_call / m.cost.cpu_us_per_call, 2),
      sequential_p50_delta_ms: round(s[v].sequential.p50_ms - m.sequential.p50_ms, 3),
      server_in_msgs_per_call: round(
        s[v].cost.server_in_msgs_per_call - m.cost.server_in_msgs_per_call,
        2,
      ),
    };
  }
  return out;
}

/** A tool that appears while the mesh runs (a new executor process): its first call vs warm. */
async function firstCallToNewTool(mesh) {
  const out = [];
  for (let k = 0; k < 3; k++) {
    const name = `fresh_${process.pid}_${k}`;
    const dir = mkdtempSync(join(tmpdir(), "toolmesh-bench-tool-"));
    writeFile(
      join(dir, `${name}.js`),
      `export default { name: ${JSON.stringify(name)}, description: "A tool new to the mesh.",
        parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
        handler: ({ text }) => text };\n`,
    );
    const proc = spawn(
      process.execPath,
      [join(HERE, "..", "services", "executor", "dist", "main.js")],
      {
        env: {
          PATH: process.env.PATH,
          NATS_URL: mesh.server.url,
          TOOLMESH_TOOLS_DIR: dir,
          TOOLMESH_EXECUTOR_OWNER: `bench-${name}`,
          TOOLMESH_LOG_LEVEL: "warn",
        },
        stdio: ["ignore", "ignore", "inherit"],
      },
    );
    try {
      // Known to the resolver once a dry run resolves it.
      for (;;) {
        const reply = await mesh.client
          .resolve("bench-fresh", { id: "d", name, arguments: { text: "x" } })
          .catch(() => undefined);
        if (reply?.ok === true) break;
        await delay(20);
      }
      const t0 = performance.now();
      await mesh.submit(name, { text: "x" });
      const first = performance.now() - t0;
      const warm = await sequential(() => mesh.submit(name, { text: "x" }), 50);
      out.push({ first_ms: round(first, 3), warm_p50_ms: warm.p50_ms });
    } finally {
      proc.kill("SIGTERM");
      await new Promise((r) => proc.once("exit", r));
      rmSync(dir, { recursive: true, force: true });
    }
  }
  return out;
}

/** A call missing its required arguments: time to the `missing_arguments` answer and to the schema. */
async function schemaExpansion() {
  log("schema expansion");
  const m = await startMesh({ name: "M+expander", expander: true });
  try {
    const error = newHistogram();
    const schema = newHistogram();
    for (let i = 0; i < 60; i++) {
      const session = m.client.session(`bench-expand-${i}`);
      const t0 = performance.now();
      const gotSchema = new Promise((resolve) => {
        const stop = session.onEvent((e) => {
          if (e.type === "schema") {
            stop();
            resolve(performance.now());
          }
        });
      });
      const res = await session.submit({ id: `e${i}`, name: "needs_args", arguments: {} }).result;
      const tError = performance.now();
      if (res.error?.code !== "missing_arguments")
        throw new Error(`expected missing_arguments, got ${JSON.stringify(res)}`);
      const tSchema = await Promise.race([gotSchema, delay(10_000).then(() => undefined)]);
      session.close();
      if (i < 10) continue; // warm-up
      error.record(Math.max(1, Math.round((tError - t0) * 1000)));
      if (tSchema !== undefined) schema.record(Math.max(1, Math.round((tSchema - t0) * 1000)));
    }
    const e = strip(summarize(error));
    const s = strip(summarize(schema));
    return { to_missing_arguments: e, to_schema: s };
  } finally {
    await m.stop();
  }
}

/** Memory of every process with `n` calls in flight, per call, over the same mesh idle. */
async function memoryPerInFlightCall(n) {
  log(`memory: ${n} calls in flight`);
  const m = await startMesh({
    name: "M+mem",
    concurrency: n,
    sessionMaxInFlight: n,
    env: { TOOLMESH_SHUTDOWN_GRACE_MS: "100" },
    nodeArgs: [
      "--expose-gc",
      "--import",
      join(dirname(fileURLToPath(import.meta.url)), "lib", "gc-probe.mjs"),
    ],
  });
  try {
    for (let i = 0; i < 200; i++) await m.submit("echo", { text: "warm" });
    await delay(1_000);
    const rss = () =>
      Object.fromEntries(Object.entries(m.pids()).map(([role, pid]) => [role, rssBytes(pid)]));
    // Heap still in use after a full collection, per service (the driver and server excluded).
    const heap = async () => {
      const used = {};
      for (const [role, pid] of Object.entries(m.pids())) {
        if (role === "driver" || role === "nats-server") continue;
        const file = join(tmpdir(), `toolmesh-gc-probe-${pid}.json`);
        rmSync(file, { force: true });
        process.kill(pid, "SIGUSR2");
        for (let i = 0; i < 100 && !existsSync(file); i++) await delay(100);
        used[role] = JSON.parse(readFileSync(file, "utf8")).heapUsed;
        rmSync(file, { force: true });
      }
      return used;
    };
    const idle = rss();
    const idleHeap = await heap();
    const until = Date.now() + 600_000;
    for (let i = 0; i < n; i++)
      void m.submit("hold", { until }, { timeoutMs: 900_000 }).catch(() => undefined);
    // In flight once every call is accepted: held by an executor (acknowledgement pending),
    // waiting in the work stream for one (the work consumer bounds what is handed out), or held
    // by a resolver for its turn (acknowledgement of the calls stream's message pending).
    const started = performance.now();
    for (;;) {
      // Slow under this load: a longer timeout than the launcher's.
      const res = await globalThis.fetch(`${m.server.monitorUrl}/jsz?consumers=true`, {
        signal: globalThis.AbortSignal.timeout(30_000),
      });
      const jsz = await res.json();
      let inFlight = 0;
      for (const acct of jsz.account_details ?? [])
        for (const st of acct.stream_detail ?? [])
          for (const c of st.consumer_detail ?? [])
            if (c.name.includes("hold")) inFlight += c.num_ack_pending + c.num_pending;
            else if (st.name.includes("_CALLS") && c.name === "resolver")
              inFlight += c.num_ack_pending;
      if (inFlight >= n) break;
      if (performance.now() - started > 180_000)
        throw new Error(`only ${inFlight} of ${n} calls in flight after 3 minutes`);
      await delay(500);
    }
    await delay(2_000);
    const busy = rss();
    const busyHeap = await heap();
    const perCall = {};
    let total = 0;
    for (const role of Object.keys(idle)) {
      const d = busy[role] - idle[role];
      perCall[role] = Math.round(d / n);
      if (role !== "driver") total += d;
    }
    return {
      in_flight: n,
      bytes_per_call_services: Math.round(total / n),
      bytes_per_call_by_process: perCall,
      heap_retained_bytes_per_call_by_service: Object.fromEntries(
        Object.keys(idleHeap).map((role) => [
          role,
          Math.round((busyHeap[role] - idleHeap[role]) / n),
        ]),
      ),
      rss_idle_mb: Object.fromEntries(
        Object.entries(idle).map(([k, v]) => [k, round(v / 2 ** 20, 1)]),
      ),
      rss_busy_mb: Object.fromEntries(
        Object.entries(busy).map(([k, v]) => [k, round(v / 2 ** 20, 1)]),
      ),
    };
  } finally {
    await m.stop();
  }
}
