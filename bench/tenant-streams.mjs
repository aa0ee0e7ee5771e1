// What 1,000 tenants cost one nats-server, for ADR 0043 and ADR 0048:
//   node bench/tenant-streams.mjs NATS_SERVER_BINARY subjects|streams [TENANTS]
// `subjects`: one calls stream, a subject per tenant's session, max_msgs_per_subject 1 000 with
// discard_new_per_subject. `streams`: a work-queue stream per tenant as ADR 0048 makes them
// (max_msgs 10 000, 1 000 per session), each with a push consumer to one literal deliver subject
// in one queue group. Prints one JSON line: set-up time, the server's RSS (MB)
// at start, idle and under load, and its CPU (%) idle for 10 s and while one publisher sends up
// to 1,000 calls/s (waiting for each PubAck) spread over the tenants for 10 s.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, AckPolicy } from "@nats-io/jetstream";
const [bin, mode, nStr] = process.argv.slice(2);
const N = Number(nStr ?? 1000);
const dir = mkdtempSync(join(tmpdir(), "toolmesh-tenants-"));
const p = spawn(
  bin,
  ["-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js", "-sd", dir, "--ports_file_dir", dir],
  { stdio: "ignore" },
);
let ports;
for (let i = 0; i < 100 && !ports; i++) {
  await new Promise((r) => setTimeout(r, 100));
  const f = readdirSync(dir).find((f) => f.endsWith(".ports"));
  if (f) ports = JSON.parse(readFileSync(dir + "/" + f, "utf8"));
}
const proc = () => {
  const s = readFileSync(`/proc/${p.pid}/stat`, "utf8").split(") ")[1].split(" ");
  const st = readFileSync(`/proc/${p.pid}/status`, "utf8");
  return {
    cpu: (Number(s[11]) + Number(s[12])) * 10,
    rss: Number(/VmRSS:\s+(\d+)/.exec(st)[1]) / 1024,
  };
};
const nc = await connect({ servers: ports.nats[0] });
const jsm = await jetstreamManager(nc);
const js = jetstream(nc);
const base = proc();
const t0 = Date.now();
if (mode === "subjects") {
  await jsm.streams.add({
    name: "C",
    subjects: ["c.*.*"],
    retention: "workqueue",
    discard: "new",
    max_msgs: 1000000,
    max_msgs_per_subject: 1000,
    discard_new_per_subject: true,
  });
  await jsm.consumers.add("C", {
    durable_name: "r",
    ack_policy: AckPolicy.Explicit,
    max_ack_pending: 10000,
  });
} else {
  for (let i = 0; i < N; i++) {
    // As `toolmesh setup --tenants` makes them (ADR 0048).
    await jsm.streams.add({
      name: `C_${i}`,
      subjects: [`c.t${i}.*`],
      retention: "workqueue",
      discard: "new",
      max_msgs: 10000,
      max_msgs_per_subject: 1000,
      discard_new_per_subject: true,
    });
    await jsm.consumers.add(`C_${i}`, {
      durable_name: "r",
      ack_policy: AckPolicy.Explicit,
      deliver_subject: "deliver.calls",
      deliver_group: "resolvers",
      max_ack_pending: 256,
      ack_wait: 10e9,
      max_deliver: 20,
    });
  }
}
const setupMs = Date.now() - t0;
// the resolver: one queue subscription (push) or one pull consumer
let got = 0;
if (mode === "subjects") {
  const c = await js.consumers.get("C", "r");
  const it = await c.consume({ max_messages: 512 });
  (async () => {
    for await (const m of it) {
      got++;
      m.ack();
    }
  })();
} else {
  nc.subscribe("deliver.calls", {
    queue: "resolvers",
    callback: (e, m) => {
      got++;
      m.respond();
    },
  });
}
await new Promise((r) => setTimeout(r, 2000));
const idle0 = proc();
await new Promise((r) => setTimeout(r, 10000));
const idle1 = proc();
// one message in every tenant's stream so every one has state, then 1,000/s for 10 s
for (let i = 0; i < N; i++) await js.publish(`c.t${i}.s1`, "x");
const l0 = proc();
const tl = Date.now();
let sent = 0;
while (Date.now() - tl < 10000) {
  const due = tl + sent;
  if (due > Date.now()) await new Promise((r) => setTimeout(r, due - Date.now()));
  await js.publish(`c.t${sent % N}.s1`, "x");
  sent++;
}
const l1 = proc();
await new Promise((r) => setTimeout(r, 1000));
console.log(
  JSON.stringify({
    version: nc.info.version,
    mode,
    tenants: N,
    setupMs,
    rssBaseMB: base.rss.toFixed(1),
    rssIdleMB: idle1.rss.toFixed(1),
    idleCpuPct: ((idle1.cpu - idle0.cpu) / 100).toFixed(2),
    rssLoadMB: l1.rss.toFixed(1),
    loadCpuPct: ((l1.cpu - l0.cpu) / ((Date.now() - 1000 - tl) / 1000) / 10).toFixed(1),
    sent,
    got,
  }),
);
await nc.close();
p.kill();
await new Promise((r) => p.once("exit", r));
rmSync(dir, { recursive: true, force: true });
