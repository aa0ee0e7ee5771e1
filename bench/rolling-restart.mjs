// How long agents' calls stall while a 3-node NATS cluster is restarted under them: the mesh
// (two resolvers, two executors, every stream and bucket replicated 3 times) serves a steady
// `--rate` of `ledger_append` calls while the cluster goes through, one after the other,
//   sigterm  a rolling restart: each node SIGTERMed, started again 5 s later, healthy again;
//   ldm      a rolling restart through lame-duck mode (SIGUSR2, `nats-server --signal ldm=PID`,
//            the NATS Helm chart's preStop), with the chart's lame_duck_duration 30 s and
//            lame_duck_grace_period 10 s;
//   kill     a SIGKILL of the node leading most streams, started again 5 s later.
// Prints, per phase (calls submitted from 2 s before its first fault until the next phase), p50/p99/max of
// the time from submit to the answer, every call's correctness and handler runs, and for each
// call slower than --slow-ms where its time went: submit (until the PubAck), calls (waiting in
// CALLS for a resolver), resolver, work (waiting in WORK for an executor), executor (from its
// pull to its result published, recording included) and delivery (to the frontend). The hops
// come from the spans every process exports (the services' by OTLP to a receiver in this
// process). `npm run build` first.
// A delivery or acknowledgement in flight on a connection as it drops is seen again only after
// the consumer's ack wait (`--ack-wait-ms`, default the product's TOOLMESH_ACK_WAIT_MS, 2 s).
// Usage: node bench/rolling-restart.mjs [--server PATH] [--rate 40] [--phases sigterm,ldm,kill]
//        [--slow-ms 1000] [--ack-wait-ms MS] [--json FILE]
import { spawn, execFileSync } from "node:child_process";
import { Buffer } from "node:buffer";
import { once } from "node:events";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { loadavg, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { benchFlags } from "./lib/flags.mjs";
import { setTimeout as sleep } from "node:timers/promises";
import { clearInterval, setInterval } from "node:timers";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import { startNatsCluster, streamLeader, stopAll } from "@toolmesh/nats-launcher";
import { createSubjects } from "@toolmesh/protocol";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const { values: flags } = benchFlags({
  options: {
    server: { type: "string", default: process.env.TOOLMESH_TEST_NATS_SERVER || "nats-server" },
    rate: { type: "string", default: "40" },
    phases: { type: "string", default: "sigterm,ldm,kill" },
    "slow-ms": { type: "string", default: "1000" },
    "ack-wait-ms": { type: "string" },
    json: { type: "string" },
  },
});
const RATE = Number(flags.rate);
const SLOW_MS = Number(flags["slow-ms"]);
const PHASES = flags.phases.split(",");
const DOWN_MS = 5_000;
const TOOL = "ledger_append";
const version = execFileSync(flags.server, ["--version"], { encoding: "utf8" }).trim();

// Spans of every process, by call id: the services export OTLP/HTTP JSON here.
const spans = new Map();
const keep = (callId, name, start, end) => {
  if (callId === undefined) return;
  let list = spans.get(callId);
  if (list === undefined) spans.set(callId, (list = []));
  list.push({ name, start, end });
};
const attr = (attrs, key) => {
  const a = attrs?.find((x) => x.key === key);
  return a?.value?.stringValue ?? a?.value?.intValue;
};
const sink = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    try {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      for (const rs of body.resourceSpans ?? [])
        for (const ss of rs.scopeSpans ?? [])
          for (const s of ss.spans ?? [])
            keep(
              attr(s.attributes, "toolmesh.call_id"),
              s.name,
              Number(BigInt(s.startTimeUnixNano) / 1_000_000n),
              Number(BigInt(s.endTimeUnixNano) / 1_000_000n),
            );
    } catch {
      // not JSON: not ours
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end("{}");
  });
});
await new Promise((resolve) => sink.listen(0, "127.0.0.1", resolve));
// The frontend's own `send` span ends with the PubAck.
const provider = new BasicTracerProvider({
  spanProcessors: [
    {
      onStart() {},
      onEnd(span) {
        if (span.name !== "send") return;
        const ms = (t) => t[0] * 1000 + t[1] / 1e6;
        keep(span.attributes["gen_ai.tool.call.id"], "send", ms(span.startTime), ms(span.endTime));
      },
      forceFlush: async () => {},
      shutdown: async () => {},
    },
  ],
});

const work = mkdtempSync(join(tmpdir(), "toolmesh-rolling-"));
const ledgerDir = join(work, "ledger");
const execDir = join(work, "exec");
mkdirSync(ledgerDir);
mkdirSync(execDir);
const cluster = await startNatsCluster({
  size: 3,
  executable: flags.server,
  // The NATS Helm chart's values.
  config: "lame_duck_duration: 30s\nlame_duck_grace_period: 10s\n",
});
const env = {
  PATH: process.env.PATH,
  NATS_URL: cluster.urls,
  TOOLMESH_STREAM_REPLICAS: "3",
  TOOLMESH_TOOLS_DIR: join(ROOT, "test", "fixtures", "tools-fault"),
  TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir, execDir }),
  TOOLMESH_LOG_LEVEL: "warn",
  ...(flags["ack-wait-ms"] === undefined ? {} : { TOOLMESH_ACK_WAIT_MS: flags["ack-wait-ms"] }),
  OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${sink.address().port}`,
  OTEL_BSP_SCHEDULE_DELAY: "1000",
  OTEL_BSP_MAX_QUEUE_SIZE: "65536",
};
execFileSync(process.execPath, [join(ROOT, "bin", "toolmesh.js"), "setup"], {
  env,
  stdio: ["ignore", "ignore", "inherit"],
});
const services = ["resolver", "resolver", "executor", "executor"].map((name) =>
  spawn(process.execPath, [join(ROOT, "services", name, "dist", "main.js")], {
    env,
    stdio: ["ignore", "ignore", "inherit"],
  }),
);

const nc = await connectNats({ servers: cluster.urls, name: "bench-frontend" });
const client = new ToolmeshClient(nc, { tracer: provider.getTracer("bench") });
const sessions = Array.from({ length: 16 }, (_, i) => client.session(`rr-${i}`));
const calls = [];
let next = 0;
const submit = (timeoutMs = 60_000) => {
  const i = next++;
  const id = `c${String(i).padStart(6, "0")}`;
  const call = { id, at: Date.now(), done: undefined, message: undefined };
  calls.push(call);
  call.settled = sessions[i % sessions.length]
    .submit({ id, name: TOOL, arguments: { work_ms: 5 + ((i * 7919) % 26) } }, { timeoutMs })
    .result.then((m) => {
      call.done = Date.now();
      call.message = m;
    });
  return call;
};
// Ready once a call goes through.
for (;;) {
  const c = submit(2_000);
  await c.settled;
  if (c.message.error === undefined) break;
}
calls.length = 0;

let loading = true;
const load = (async () => {
  const start = Date.now();
  for (let i = 0; loading; i++) {
    await sleep(Math.max(0, start + (i * 1000) / RATE - Date.now()));
    submit();
  }
})();

const subjects = createSubjects();
const log = [];
const t0 = Date.now();
const stamp = (what) => {
  log.push(`${((Date.now() - t0) / 1000).toFixed(1).padStart(6)}s ${what}`);
  console.error(log.at(-1));
};
const phases = [];
const loads = [];
const loadTimer = setInterval(() => loads.push(loadavg()[0]), 5_000);
await sleep(3_000);
phases.push({ name: "steady", from: Date.now() });
await sleep(7_000);
for (const phase of PHASES) {
  // A phase's calls start a little before its first fault: those are in flight when it hits.
  phases.push({ name: phase, from: Date.now() - 2_000 });
  if (phase === "kill") {
    // The node leading most streams.
    const names = await jsList();
    const counts = new Map();
    for (const s of names) {
      const leader = await streamLeader(nc, s);
      if (leader !== undefined) counts.set(leader, (counts.get(leader) ?? 0) + 1);
    }
    const target = [...counts.entries()].sort((a, b) => b[1] - a[1])[0][0];
    const killedAt = Date.now();
    await cluster.node(target).kill();
    stamp(`SIGKILL ${target} (leads ${counts.get(target)} of ${names.length} streams)`);
    // How long the servers took to elect new leaders where a call passes: what no client
    // setting shortens.
    const critical = [
      ["stream", subjects.streams.calls],
      ["consumer", `${subjects.streams.calls}.${subjects.resolverConsumer}`],
      ["stream", `KV_${subjects.callsBucket}`],
      ["stream", subjects.streams.work],
      ["consumer", `${subjects.streams.work}.${subjects.workConsumer(TOOL)}`],
      ["stream", subjects.streams.sessions],
    ];
    const elected = await Promise.all(
      critical.map(async ([kind, name]) => {
        for (;;) {
          const info = await nc
            .request(`$JS.API.${kind.toUpperCase()}.INFO.${name}`, undefined, { timeout: 500 })
            .then((m) => m.json())
            .catch(() => undefined);
          const leader = info?.cluster?.leader;
          if (leader !== undefined && leader !== target)
            return `${name} ${Date.now() - killedAt} ms`;
          if (Date.now() - killedAt > 60_000) return `${name} none`;
          await sleep(100);
        }
      }),
    );
    stamp(`new leaders after the kill: ${elected.join(", ")}`);
    await sleep(Math.max(0, killedAt + DOWN_MS - Date.now()));
    await cluster.node(target).restart();
    stamp(`${target} started`);
    await cluster.waitHealthy(120_000);
    stamp("cluster healthy");
  } else {
    for (const node of cluster.nodes) {
      if (phase === "ldm") await node.lameDuck();
      else await node.terminate();
      stamp(`${node.name} ${phase === "ldm" ? "left lame-duck mode" : "stopped (SIGTERM)"}`);
      await sleep(DOWN_MS);
      await node.restart();
      stamp(`${node.name} started`);
      await cluster.waitHealthy(120_000);
      stamp("cluster healthy");
    }
  }
  await sleep(5_000);
}
phases.push({ name: "end", from: Date.now() });
loading = false;
await load;
await Promise.all(calls.map((c) => c.settled));
clearInterval(loadTimer);
await sleep(3_000); // the last spans
for (const s of sessions) s.close();
await nc.close();
for (const p of services) p.kill("SIGTERM");
await Promise.all(services.map((p) => (p.exitCode === null ? once(p, "exit") : undefined)));
await cluster.stop();
await stopAll();
sink.close();

async function jsList() {
  const buckets = Object.entries(subjects).filter(([k]) => k.endsWith("Bucket"));
  return [...Object.values(subjects.streams), ...buckets.map(([, b]) => `KV_${b}`)];
}

// ---- Figures ----
const runs = new Map();
for (const name of readdirSync(execDir))
  for (const line of readFileSync(join(execDir, name), "utf8").split("\n"))
    if (line !== "") runs.set(line.split("\t")[0], (runs.get(line.split("\t")[0]) ?? 0) + 1);
const effects = new Set(
  readdirSync(ledgerDir).map((n) => {
    const key = Buffer.from(n, "base64url").toString("utf8");
    return key.slice(key.lastIndexOf("/") + 1);
  }),
);
rmSync(work, { recursive: true, force: true });

const pct = (sorted, p) =>
  sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const HOPS = ["submit", "calls", "resolver", "work", "executor", "delivery"];
function hops(call) {
  const list = spans.get(call.id) ?? [];
  const first = (pred) => Math.min(...list.filter(pred).map((s) => s.start));
  const last = (pred) => Math.max(...list.filter(pred).map((s) => s.end));
  const acked = last((s) => s.name === "send");
  const resolveStart = first((s) => s.name === "resolve");
  const resolveEnd = last((s) => s.name === "resolve");
  const processStart = first((s) => s.name.startsWith("process "));
  const processEnd = last((s) => s.name.startsWith("process "));
  const marks = [call.at, acked, resolveStart, resolveEnd, processStart, processEnd, call.done];
  if (!marks.every(Number.isFinite)) return undefined;
  return Object.fromEntries(HOPS.map((h, i) => [h, Math.max(0, marks[i + 1] - marks[i])]));
}
const report = { server: version, rate: RATE, phases: [] };
console.log(
  `rolling restarts of a 3-node cluster (${version}), ${RATE} calls/s, replicas 3, ack wait ${flags["ack-wait-ms"] ?? "default"}`,
);
for (const l of log) console.log(`  ${l}`);
for (let i = 0; i < phases.length - 1; i++) {
  const { name, from } = phases[i];
  const to = phases[i + 1].from;
  const inPhase = calls.filter((c) => c.at >= from && c.at < to);
  const lat = inPhase.map((c) => c.done - c.at).sort((a, b) => a - b);
  const wrong = inPhase.filter((c) => c.message?.error !== undefined || !effects.has(c.id));
  const twice = inPhase.filter((c) => (runs.get(c.id) ?? 0) > 1);
  const slow = inPhase.filter((c) => c.done - c.at > SLOW_MS);
  const blame = Object.fromEntries(HOPS.map((h) => [h, 0]));
  const unknown = [];
  for (const c of slow) {
    const h = hops(c);
    if (h === undefined) {
      unknown.push(c.id);
      continue;
    }
    // The slow call's time goes to the hop that took longest.
    const worst = HOPS.reduce((a, b) => (h[a] >= h[b] ? a : b));
    blame[worst] += 1;
  }
  const row = {
    phase: name,
    calls: inPhase.length,
    correct: inPhase.length - wrong.length,
    ranTwice: twice.length,
    p50: pct(lat, 50),
    p99: pct(lat, 99),
    max: lat.at(-1),
    slow: slow.length,
    slowestHop: blame,
    unknownHops: unknown.length,
  };
  report.phases.push(row);
  console.log(
    `  ${name.padEnd(8)} calls ${String(row.calls).padStart(5)}  correct ${String(row.correct).padStart(5)}  ran twice ${row.ranTwice}  p50/p99/max ${row.p50}/${row.p99}/${row.max} ms  slow(>${SLOW_MS}) ${row.slow}: ${HOPS.filter(
      (h) => blame[h] > 0,
    )
      .map((h) => `${h} ${blame[h]}`)
      .join(", ")}${unknown.length > 0 ? `, no spans ${unknown.length}` : ""}`,
  );
  const slowest = [...slow].sort((a, b) => b.done - b.at - (a.done - a.at)).slice(0, 5);
  for (const c of slowest) {
    const h = hops(c);
    console.log(
      `      ${c.id} ${c.done - c.at} ms at ${((c.at - t0) / 1000).toFixed(1)}s: ${h === undefined ? "no spans" : HOPS.map((k) => `${k} ${h[k]}`).join(", ")}`,
    );
  }
}
report.loadavg1 = {
  max: Math.max(...loads),
  mean: loads.reduce((a, b) => a + b, 0) / loads.length,
};
console.log(
  `  load average (1 min) during the run: mean ${report.loadavg1.mean.toFixed(1)}, max ${report.loadavg1.max.toFixed(1)}`,
);
if (flags.json !== undefined) writeFileSync(flags.json, JSON.stringify(report, null, 2));
