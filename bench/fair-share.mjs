// Fair share under a flood, in one run:
// `node bench/fair-share.mjs [--smoke] [--out DIR] [--compare-root DIR]`.
//
// One tool whose executors serve CAPACITY calls per second. Tenant B makes steady calls alone
// first (its baseline), then again while tenant A floods the same tool at ten times CAPACITY,
// with A's quota (max_in_flight, max_queued) set. Once with fair share on, once with it off
// (quota only), same run. Passes when B's p99 under the flood stays within 1.5× of B alone, none
// of B's calls is refused or late, and every one of A's calls is answered: run, or refused by
// its quota. During the flood an executor replica is added (a third of the way in) and the first
// one removed (two thirds in, SIGTERM), as an autoscaler would; fair share runs with defaults,
// its window the capacity the replicas announce. Writes fair-share.json to --out (default bench/results/). `--compare-root DIR` runs
// the fair-share scenario a second time with the services built in another checkout (a built
// `git worktree` of main), for before/after figures from one run; it does not decide the verdict.
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { fileURLToPath } from "node:url";
import { performance } from "node:perf_hooks";
import { createSubjects } from "@toolmesh/protocol";
import { QuotaStore } from "@toolmesh/catalog";
import { ToolmeshClient } from "@toolmesh/client";
import { newHistogram, round, summarize } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: flags } = benchFlags({
  options: {
    smoke: { type: "boolean", default: false },
    out: { type: "string", default: join(HERE, "results") },
    "compare-root": { type: "string" },
  },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);

const SERVICE_MS = 1_000;
const CONCURRENCY = 4; // one executor: 4 calls at once → 4 calls/s
const CAPACITY = (CONCURRENCY * 1000) / SERVICE_MS;
const FLOOD_RATE = 10 * CAPACITY;
const B_RATE = 1;
const DURATION_MS = flags.smoke ? 10_000 : 30_000;
const B_TIMEOUT_MS = 10_000;
const A_QUOTA = { max_in_flight: 8, max_queued: 4 };

/** Open loop of `rate` calls/s for `durationMs` through `session`s; resolves with every message. */
async function drive(sessions, tag, rate, durationMs, timeoutMs, onResult) {
  const n = Math.round((rate * durationMs) / 1000);
  const started = performance.now();
  const pending = [];
  for (let i = 0; i < n; i++) {
    const due = started + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    const sentAt = performance.now();
    const session = sessions[i % sessions.length];
    pending.push(
      session
        .submit({ id: `${tag}-${i}`, name: "work", arguments: { ms: SERVICE_MS } }, { timeoutMs })
        .result.then((m) => onResult(m, performance.now() - sentAt)),
    );
  }
  return Promise.all(pending);
}

function tenantB(mesh) {
  const client = new ToolmeshClient(mesh.nc, { tenant: "tenant-b" });
  return Array.from({ length: 4 }, (_, i) => client.session(`b-${i}`));
}

function tenantA(mesh) {
  const client = new ToolmeshClient(mesh.nc, { tenant: "tenant-a" });
  return Array.from({ length: 16 }, (_, i) => client.session(`a-${i}`));
}

/** Adds an executor replica a third of the way into the flood, removes the first two thirds in. */
async function replicaChurn(mesh) {
  await new Promise((r) => setTimeout(r, DURATION_MS / 3));
  mesh.addExecutor();
  await new Promise((r) => setTimeout(r, DURATION_MS / 3));
  await mesh.remove("executor");
}

async function phase(mesh, label, flood) {
  const hB = newHistogram();
  const b = { ok: 0, refused: 0, late: 0, errors: {} };
  const a = { submitted: 0, ok: 0, answered: 0, by_code: {} };
  const bSessions = tenantB(mesh);
  const aSessions = flood ? tenantA(mesh) : [];
  const bRun = drive(bSessions, `${label}-b`, B_RATE, DURATION_MS, B_TIMEOUT_MS, (m, ms) => {
    if (m.error === undefined) {
      b.ok++;
      hB.record(Math.max(1, Math.round(ms * 1000)));
    } else {
      b.errors[m.error.code] = (b.errors[m.error.code] ?? 0) + 1;
      if (m.error.code === "deadline_exceeded") b.late++;
      else b.refused++;
    }
  });
  const aRun = flood
    ? drive(aSessions, `${label}-a`, FLOOD_RATE, DURATION_MS, 30_000, (m) => {
        a.answered++;
        const code = m.error?.code ?? "ok";
        const key =
          m.error?.details?.quota === undefined ? code : `${code}:${m.error.details.quota}`;
        a.by_code[key] = (a.by_code[key] ?? 0) + 1;
        if (m.error === undefined) a.ok++;
      })
    : Promise.resolve([]);
  a.submitted = flood ? Math.round((FLOOD_RATE * DURATION_MS) / 1000) : 0;
  const churn = flood ? replicaChurn(mesh) : Promise.resolve();
  await Promise.all([bRun, aRun, churn]);
  for (const s of [...bSessions, ...aSessions]) s.close();
  const summary = summarize(hB);
  delete summary.cdf;
  log(`${label}: B ${JSON.stringify(summary)} ${JSON.stringify(b)} A ${JSON.stringify(a)}`);
  return {
    b: { latency: summary, ...b },
    a: flood ? { ...a, ok_per_s: round(a.ok / (DURATION_MS / 1000), 1) } : undefined,
  };
}

/** `window` undefined: defaults (fair share on, each tool's window its announced capacity). */
async function scenario(window, root) {
  const mesh = await startMesh({
    name: `fair-${window ?? "default"}`,
    concurrency: CONCURRENCY,
    env: window === undefined ? {} : { TOOLMESH_FAIR_SHARE_WINDOW: String(window) },
    ...(root === undefined ? {} : { root }),
  });
  try {
    const store = await QuotaStore.open(mesh.nc, { subjects: createSubjects() });
    await store.set({ tenant: "tenant-a" }, A_QUOTA);
    // Warm up the tool's consumer and the quota watch.
    await mesh.submit("work", { ms: 1 }, { timeoutMs: 5_000 });
    const label = `window ${window ?? "default"}${root === undefined ? "" : ` (${root})`}`;
    const alone = await phase(mesh, `${label}, B alone`, false);
    const flooded = await phase(mesh, `${label}, B with A's flood`, true);
    return { alone, flooded };
  } finally {
    await mesh.stop();
  }
}

const compareRoot = flags["compare-root"];
const fair = await scenario(undefined);
const before = compareRoot === undefined ? undefined : await scenario(undefined, compareRoot);
const fifo = await scenario(0);
const ratio = (s) => round(s.flooded.b.latency.p99_ms / s.alone.b.latency.p99_ms, 2);
const result = {
  setup: {
    service_ms: SERVICE_MS,
    executor_concurrency: CONCURRENCY,
    capacity_per_s: CAPACITY,
    flood_rate_per_s: FLOOD_RATE,
    b_rate_per_s: B_RATE,
    duration_ms: DURATION_MS,
    a_quota: A_QUOTA,
    fair_share_window: "default (announced capacity)",
    replica_churn: "one executor added at 1/3 of the flood, the first removed at 2/3 (SIGTERM)",
  },
  fair_share: { ...fair, b_p99_ratio: ratio(fair) },
  ...(before === undefined
    ? {}
    : { fair_share_before: { root: compareRoot, ...before, b_p99_ratio: ratio(before) } }),
  quota_only: { ...fifo, b_p99_ratio: ratio(fifo) },
  // What fair share costs the flooding tenant: its calls run per second, against quota only.
  a_throughput_cost: round(1 - fair.flooded.a.ok_per_s / fifo.flooded.a.ok_per_s, 3),
};
const failures = [];
if (result.fair_share.b_p99_ratio > 1.5)
  failures.push(`B's p99 ratio ${result.fair_share.b_p99_ratio} > 1.5`);
if (fair.flooded.b.refused + fair.flooded.b.late > 0) failures.push("B had calls refused or late");
if (fair.flooded.a.answered !== fair.flooded.a.submitted)
  failures.push("A's calls were not all answered");
const unexpected = Object.keys(fair.flooded.a.by_code).filter(
  (k) => k !== "ok" && !k.startsWith("quota_exceeded:"),
);
if (unexpected.length > 0)
  failures.push(`A got other answers than its quota implies: ${unexpected}`);
result.pass = failures.length === 0;
result.failures = failures;
mkdirSync(flags.out, { recursive: true });
writeFileSync(join(flags.out, "fair-share.json"), `${JSON.stringify(result, null, 2)}\n`);
log(
  JSON.stringify({
    fair_share: result.fair_share.b_p99_ratio,
    ...(before === undefined ? {} : { fair_share_before: result.fair_share_before.b_p99_ratio }),
    quota_only: result.quota_only.b_p99_ratio,
    a_ok_per_s: { fair_share: fair.flooded.a.ok_per_s, quota_only: fifo.flooded.a.ok_per_s },
    a_throughput_cost: result.a_throughput_cost,
    pass: result.pass,
    failures,
  }),
);
process.exit(result.pass ? 0 : 1);
