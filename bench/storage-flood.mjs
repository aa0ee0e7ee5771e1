// One tenant flooding the store with large results, in one run:
// `node bench/storage-flood.mjs [--smoke] [--out DIR] [--cpu-prof DIR] [--max-bytes-in-flight N]
// [--floors]` (after `npm run build`); --cpu-prof writes each service's CPU profile (node
// --cpu-prof) to DIR/<variant> when it stops; --max-bytes-in-flight sets the gated run's
// TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT (default: the mesh's default). --floors adds two variants
// that say what the machine alone does to B: A floods a mesh of its own on the same nats-server
// (`services_apart`: B shares the server and the cores with A), then a mesh and server of its own
// (`server_apart`: B shares only the cores); they are reported, not judged.
//
// Tenant B makes small echo calls at a steady rate alone (its baseline), then again while tenant
// A, within any call quota, keeps FLOOD_IN_FLIGHT echo calls in flight whose results are of
// random sizes up to RESULT_MAX (half of them at the largest). A is another frontend: it floods
// from a thread of its own with a connection of its own, so B's figures are what the mesh does to
// B, not A's results queued on B's socket and parsed on B's event loop. Twice in one run, each on a mesh
// of its own: without the bytes-in-flight bound (TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT=0, as before
// it) and with it; the verdict is the second's. The mesh runs with
// TOOLMESH_STORE_BYTES = STORE_BYTES, so each stream has its byte bound (ADR 0050). Reports B's
// p99 flooded/alone, B's calls lost (any answer but a result), what A was answered, and the
// store: the sessions stream's and the call records' bytes against their bounds and what the
// account stores, sampled through the flood. Writes storage-flood.json to --out (default
// bench/results/). Passes when B lost nothing and its p99 under the flood stays within 1.5× of B
// alone, A lost nothing (each call answered with its result or a storage refusal), and neither
// the sessions stream nor the call records outgrew its bound; the store figures
// say what A's results occupy against its bound of stored results (TOOLMESH_TENANT_MAX_STORED_BYTES,
// default 64 MiB), past which A is refused `quota_exceeded` `storage`: its workers then wait
// a second (a client honouring retry_after_ms, capped) before calling again.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { clearInterval, setInterval } from "node:timers";
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import { Defaults, createSubjects } from "@toolmesh/protocol";
import { newHistogram, round, summarize } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    out: { type: "string", default: join(HERE, "results") },
    "cpu-prof": { type: "string" },
    "max-bytes-in-flight": { type: "string" },
    floors: { type: "boolean", default: false },
  },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);

const STORE_BYTES = 256 * 1024 * 1024;
const RESULT_MAX = 500 * 1024;
const FLOOD_IN_FLIGHT = 16;
const B_RATE = 20;
const DURATION_MS = flags.smoke ? 10_000 : 30_000;
const B_TIMEOUT_MS = 10_000;
const subjects = createSubjects();

/** B's open loop of small calls; resolves with its histogram and what it was answered. */
async function steady(nc) {
  const client = new ToolmeshClient(nc, { tenant: "tenant-b" });
  const sessions = Array.from({ length: 4 }, (_, i) => client.session(`b-${i}`));
  const h = newHistogram();
  const b = { ok: 0, lost: 0, errors: {} };
  const n = Math.round((B_RATE * DURATION_MS) / 1000);
  const started = performance.now();
  const pending = [];
  for (let i = 0; i < n; i++) {
    const wait = started + (i * 1000) / B_RATE - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    const sentAt = performance.now();
    const handle = sessions[i % sessions.length].submit(
      { id: `b-${Date.now()}-${i}`, name: "echo", arguments: { text: "hi" } },
      { timeoutMs: B_TIMEOUT_MS },
    );
    pending.push(
      handle.result.then(
        (m) => {
          if (m.error === undefined) {
            b.ok++;
            h.record(Math.max(1, Math.round((performance.now() - sentAt) * 1000)));
          } else {
            b.lost++;
            b.errors[m.error.code] = (b.errors[m.error.code] ?? 0) + 1;
          }
        },
        (err) => {
          b.lost++;
          b.errors[err.code ?? "thrown"] = (b.errors[err.code ?? "thrown"] ?? 0) + 1;
        },
      ),
    );
  }
  await Promise.all(pending);
  for (const s of sessions) s.close();
  const latency = summarize(h);
  delete latency.cdf;
  return { latency, ...b };
}

/**
 * A's closed loop of FLOOD_IN_FLIGHT large-result calls until `until()` says stop, to the mesh of
 * subject `prefix`.
 */
async function floodLoop(nc, prefix, until) {
  const client = new ToolmeshClient(nc, { tenant: "tenant-a", prefix });
  const sessions = Array.from({ length: 16 }, (_, i) => client.session(`a-${i}`));
  const a = { calls: 0, result_bytes: 0, by_code: {} };
  let next = 0;
  const worker = async () => {
    while (!until()) {
      const i = next++;
      const size = Math.random() < 0.5 ? RESULT_MAX : Math.floor(Math.random() * RESULT_MAX);
      const m = await sessions[i % sessions.length]
        .submit(
          { id: `a-${i}`, name: "echo", arguments: { text: "x".repeat(Math.max(1, size)) } },
          { timeoutMs: 30_000 },
        )
        .result.catch((err) => ({ error: { code: err.code ?? "thrown" } }));
      a.calls++;
      const code = m.error === undefined ? "ok" : `${m.error.code}:${m.error.details?.limit ?? ""}`;
      a.by_code[code] = (a.by_code[code] ?? 0) + 1;
      if (m.error === undefined) a.result_bytes += m.content.length;
      else if (m.error.details?.limit === "storage")
        await new Promise((r) => setTimeout(r, Math.min(1_000, m.error.details.retry_after_ms)));
    }
  };
  await Promise.all(Array.from({ length: FLOOD_IN_FLIGHT }, worker));
  for (const s of sessions) s.close();
  return a;
}

/**
 * A's flood from a thread of its own, connected to `url` on its own, to the mesh of subject
 * `prefix`; `stop()` ends it and resolves with what A was answered.
 */
function startFlood(url, prefix) {
  const worker = new Worker(fileURLToPath(import.meta.url), { workerData: { url, prefix } });
  const done = new Promise((resolve, reject) => {
    worker.once("message", resolve);
    worker.once("error", reject);
  });
  return {
    stop: async () => {
      worker.postMessage("stop");
      const a = await done;
      await worker.terminate();
      return a;
    },
  };
}

/** The flood thread: floods until told to stop, then posts what A was answered. */
async function floodThread({ url, prefix }) {
  const nc = await connect({ servers: url, noAsyncTraces: true });
  let stop = false;
  parentPort.once("message", () => (stop = true));
  const a = await floodLoop(nc, prefix, () => stop);
  await nc.close();
  parentPort.postMessage(a);
}

/** What the store holds now: the sessions stream, the call records, the account. */
async function store(jsm) {
  const info = async (name) => {
    const i = await jsm.streams.info(name).catch(() => undefined);
    return i === undefined ? undefined : { bytes: i.state.bytes, max_bytes: i.config.max_bytes };
  };
  return {
    sessions: await info(subjects.streams.sessions),
    records: await info(`KV_${subjects.callsBucket}`),
    account_bytes: (await jsm.getAccountInfo()).storage,
  };
}

/**
 * One mesh, one tenant-b baseline and one flood, with `env` on every service. `apart` floods a
 * second mesh instead: on the same server (`"services"`) or on a server of its own (`"server"`).
 */
async function runVariant(name, env, apart) {
  const meshOf = (options) =>
    startMesh({
      concurrency: 64,
      env: {
        TOOLMESH_STORE_BYTES: String(STORE_BYTES),
        TOOLMESH_TENANT_MAX_STORED_BYTES: String(Defaults.tenantMaxStoredBytes),
        ...env,
      },
      nodeArgs: flags["cpu-prof"]
        ? ["--cpu-prof", `--cpu-prof-dir=${join(flags["cpu-prof"], name)}`]
        : [],
      ...options,
    });
  const mesh = await meshOf({ name: `storage-flood-${name}` });
  const flooded =
    apart === undefined
      ? mesh
      : await meshOf({
          name: `storage-flood-${name}-a`,
          ...(apart === "services" && { onServer: mesh.server, prefix: "flood" }),
        });
  try {
    return await measureVariant(name, env, mesh, flooded);
  } finally {
    if (flooded !== mesh) await flooded.stop();
    await mesh.stop();
  }
}

/** B alone on `mesh`, then B while A floods `flooded` (`mesh` itself, or a mesh apart). */
async function measureVariant(name, env, mesh, target) {
  const jsm = await jetstreamManager(mesh.nc);
  const alone = await steady(mesh.nc);
  log(`${name}: B alone: ${JSON.stringify(alone)}`);
  const samples = [];
  const sampler = setInterval(() => {
    void store(jsm).then((s) => samples.push(s));
  }, 1_000);
  const floodRun = startFlood(target.server.url, target === mesh ? undefined : "flood");
  const flooded = await steady(mesh.nc);
  const a = await floodRun.stop();
  clearInterval(sampler);
  const after = await store(jsm);
  log(`${name}: B flooded: ${JSON.stringify(flooded)}; A ${JSON.stringify(a)}`);
  const most = (key) => Math.max(...samples.map((s) => s[key]?.bytes ?? s[key] ?? 0));
  return {
    env,
    b_alone: alone,
    b_flooded: flooded,
    b_p99_ratio: round(flooded.latency.p99_ms / alone.latency.p99_ms, 2),
    a,
    store: {
      sessions_max_bytes: after.sessions?.max_bytes,
      sessions_most_bytes: most("sessions"),
      records_max_bytes: after.records?.max_bytes,
      records_most_bytes: most("records"),
      account_most_bytes: most("account_bytes"),
      after,
    },
  };
}

/** Why a variant fails: B lost calls, B's p99 ratio over 1.5, a stream over its bound. */
function failuresOf(v) {
  const failures = [];
  if (v.b_alone.lost > 0 || v.b_flooded.lost > 0)
    failures.push(`B lost ${v.b_alone.lost + v.b_flooded.lost} calls`);
  if (v.b_p99_ratio > 1.5) failures.push(`B's p99 ratio ${v.b_p99_ratio} > 1.5`);
  if (v.store.sessions_most_bytes > (v.store.after.sessions?.max_bytes ?? Infinity))
    failures.push("the sessions stream outgrew its bound");
  if (v.store.records_most_bytes > (v.store.after.records?.max_bytes ?? Infinity))
    failures.push("the call records outgrew their bound");
  const aLost = Object.entries(v.a.by_code).filter(
    ([code]) => !/^(ok|quota_exceeded):/.test(`${code}:`),
  );
  if (aLost.length > 0) failures.push(`A lost calls: ${JSON.stringify(Object.fromEntries(aLost))}`);
  return failures;
}

if (!isMainThread) {
  await floodThread(workerData);
} else {
  await main();
}

async function main() {
  // Same run: without the bytes-in-flight gate (as before it), then with it as configured by default.
  const variants = {
    ungated: await runVariant("ungated", { TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT: "0" }),
    gated: await runVariant(
      "gated",
      flags["max-bytes-in-flight"] === undefined
        ? {}
        : { TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT: flags["max-bytes-in-flight"] },
    ),
  };
  if (flags.floors) {
    variants.services_apart = await runVariant("services-apart", {}, "services");
    variants.server_apart = await runVariant("server-apart", {}, "server");
  }
  const failures = failuresOf(variants.gated);
  const result = {
    setup: {
      store_bytes: STORE_BYTES,
      result_max_bytes: RESULT_MAX,
      flood_in_flight: FLOOD_IN_FLIGHT,
      b_rate_per_s: B_RATE,
      duration_ms: DURATION_MS,
    },
    ...variants,
    ungated_failures: failuresOf(variants.ungated),
    pass: failures.length === 0,
    failures,
  };
  mkdirSync(flags.out, { recursive: true });
  writeFileSync(join(flags.out, "storage-flood.json"), `${JSON.stringify(result, null, 2)}\n`);
  log(
    JSON.stringify({
      ungated: variants.ungated.b_p99_ratio,
      gated: variants.gated.b_p99_ratio,
      ...(flags.floors && {
        services_apart: variants.services_apart.b_p99_ratio,
        server_apart: variants.server_apart.b_p99_ratio,
      }),
      failures,
      pass: result.pass,
    }),
  );
  process.exit(result.pass ? 0 : 1);
}
