// What S2 compression saves on disk, for ADR 0044 (`s2` needs nats-server 2.10+):
//   node bench/stream-compression.mjs NATS_SERVER_BINARY none|s2 [CALLS] [switch]
// Stores, per call, a call, a work item, a result and a call record shaped like the mesh's (ids,
// trace ids and tool output varied) in three streams and a KV bucket with that compression, then
// prints the server's CPU (ms), the stream info's compression, and, after the server stopped,
// the store directory's size per stream (KB, `du -sk`). `switch` turns compression on in place
// after storing, to show that sealed blocks keep the compression they were written with.
import { execSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { startNatsServer, stopAll } from "@toolmesh/nats-launcher";

const [bin, mode, callsArg, then] = process.argv.slice(2);
if (bin === undefined || (mode !== "none" && mode !== "s2"))
  throw new Error(
    "usage: node bench/stream-compression.mjs NATS_SERVER_BINARY none|s2 [CALLS] [switch]",
  );
const calls = Number(callsArg ?? 10_000);
const server = await startNatsServer({ executable: bin });
const nc = await connect({ servers: server.url });
const version = nc.info?.version;
const jsm = await jetstreamManager(nc);
const js = jetstream(nc);
const compression = mode === "s2" ? { compression: "s2" } : {};
for (const [name, subject] of [
  ["CALLS", "c.>"],
  ["WORK", "w.>"],
  ["SESSIONS", "s.>"],
])
  await jsm.streams.add({ name, subjects: [subject], storage: "file", ...compression });
const kv = await new Kvm(nc).create("calls", mode === "s2" ? { compression: true } : {});

const hex = (n) => randomUUID().replace(/-/g, "").slice(0, n);
const cities = ["Berlin", "Paris", "Lisbon", "Oslo", "Madrid"];
const summaries = ["light rain", "overcast", "sunny intervals", "fog"];
for (let i = 0; i < calls; i++) {
  const session = `sess-${i % 50}`;
  const id = `call_${hex(24)}`;
  const args = { city: cities[i % 5], days: 3, units: "metric" };
  const context = { user_id: `u-${i % 200}`, locale: "en-GB" };
  const call = {
    tool_call: {
      id,
      type: "function",
      function: { name: "weather.get_forecast", arguments: JSON.stringify(args) },
    },
    session_id: session,
    agent: "planner",
    timeout_ms: 30_000,
    context,
  };
  const work = {
    call_id: randomUUID(),
    tenant: "acme",
    session_id: session,
    tool: "weather.get_forecast",
    tool_call_id: id,
    arguments: args,
    context,
    deadline: Date.now() + 30_000,
    attempt: 1,
    trace: { traceparent: `00-${hex(32)}-${hex(16)}-01` },
  };
  const days = [0, 1, 2].map((d) => ({
    date: `2026-11-${27 + d}`,
    high_c: 5 + ((i + d) % 7),
    low_c: (i + d) % 4,
    precipitation_mm: ((i * 7 + d) % 30) / 10,
    wind_kph: 10 + ((i + d) % 20),
    summary: summaries[(i + d) % 4],
  }));
  const content = JSON.stringify({ city: args.city, days });
  const result = {
    tool_call_id: id,
    role: "tool",
    status: "ok",
    content,
    call_id: work.call_id,
    duration_ms: 120 + (i % 300),
    attempts: 1,
  };
  const now = new Date().toISOString();
  const record = {
    ...work,
    state: "succeeded",
    result: content,
    created_at: now,
    finished_at: now,
    revision: 3,
  };
  await Promise.all([
    js.publish(`c.acme.${session}`, JSON.stringify(call)),
    js.publish("w.acme.weather", JSON.stringify(work)),
    js.publish(`s.acme.${session}.${id}`, JSON.stringify(result)),
    kv.put(`acme.${work.call_id}`, JSON.stringify(record)),
  ]);
}
const stat = readFileSync(`/proc/${server.pid}/stat`, "utf8").split(") ")[1].split(" ");
const serverCpuMs = (Number(stat[11]) + Number(stat[12])) * 10;
if (then === "switch") {
  for (const name of ["CALLS", "WORK", "SESSIONS", "KV_calls"]) {
    const { config } = await jsm.streams.info(name);
    await jsm.streams.update(name, { ...config, compression: "s2" });
  }
  await new Promise((r) => setTimeout(r, 3_000));
}
const compressions = {};
for (const name of ["CALLS", "WORK", "SESSIONS", "KV_calls"])
  compressions[name] = (await jsm.streams.info(name)).config.compression ?? "(none sent)";
await nc.close();
await server.terminate();
const du = (path) => Number(execSync(`du -sk '${path}'`).toString().split("\t")[0]);
const root = `${server.storeDir}/jetstream/$G/streams`;
const kb = { total: du(`${server.storeDir}/jetstream`) };
for (const name of ["CALLS", "WORK", "SESSIONS", "KV_calls"]) kb[name] = du(`${root}/${name}`);
console.log(JSON.stringify({ version, mode, calls, then, serverCpuMs, compressions, kb }));
await server.stop();
await stopAll();
