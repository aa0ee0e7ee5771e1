// Profiles the mesh: resolver and executor processes (and the gateway, with `--gateway`: the calls
// then come from MCP clients through it) run with `--cpu-prof` while a closed loop of `echo` calls
// goes through them; prints the functions with the most self time per process. `--gateway --http`
// sends the calls from the minimal JSON-RPC client instead of MCP SDK clients.
// `--audit` records every call in the tenant's audit trail (TOOLMESH_AUDIT=required).
// Usage: node bench/profile.mjs [--seconds 10] [--dir DIR] [--tracing] [--audit] [--gateway [--http]]
// (`npm run build` first)
import { mkdirSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { benchFlags } from "./lib/flags.mjs";
import { jetstreamManager } from "@nats-io/jetstream";
import { createSubjects } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import { closedLoop } from "./lib/measure.mjs";
import { payloadOf, startMesh } from "./lib/systems.mjs";

const { values: flags } = benchFlags({
  options: {
    seconds: { type: "string", default: "10" },
    dir: { type: "string", default: join(tmpdir(), `toolmesh-profile-${process.pid}`) },
    top: { type: "string", default: "25" },
    tracing: { type: "boolean", default: false },
    audit: { type: "boolean", default: false },
    gateway: { type: "boolean", default: false },
    http: { type: "boolean", default: false },
  },
});
mkdirSync(flags.dir, { recursive: true });
const mesh = await startMesh({
  tracing: flags.tracing,
  gateway: flags.gateway,
  nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${flags.dir}`],
  ...(flags.audit && {
    env: { TOOLMESH_AUDIT: "required" },
    prepare: async (nc) =>
      ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(createSubjects(), "default")),
  }),
});
const call = flags.gateway && flags.http ? mesh.callHttp : mesh.call;
let calls;
const roles = new Map(Object.entries(mesh.pids()).map(([role, pid]) => [String(pid), role]));
try {
  const payload = payloadOf(1024);
  await closedLoop(call, { inFlight: 64, durationMs: 2_000, payload });
  ({ calls } = await closedLoop(call, {
    inFlight: 64,
    durationMs: Number(flags.seconds) * 1_000,
    payload,
  }));
} finally {
  await mesh.stop();
}
console.log(`${calls} calls; profiles in ${flags.dir}\n`);
for (const file of readdirSync(flags.dir).filter((f) => f.endsWith(".cpuprofile"))) {
  const profile = JSON.parse(readFileSync(join(flags.dir, file), "utf8"));
  const self = new Map();
  const dt = new Map();
  profile.samples.forEach((id, i) => dt.set(id, (dt.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  let total = 0;
  for (const node of profile.nodes) {
    const t = dt.get(node.id) ?? 0;
    total += t;
    const { functionName, url, lineNumber } = node.callFrame;
    const where = url
      .replace(/^.*\/node_modules\//, "")
      .replace(/^file:\/\/.*?\/(libs|services)\//, "$1/");
    const key = `${functionName || "(anonymous)"} ${where}:${lineNumber + 1}`;
    self.set(key, (self.get(key) ?? 0) + t);
  }
  const idle = [...self.entries()]
    .filter(([k]) => k.startsWith("(idle)"))
    .reduce((a, [, v]) => a + v, 0);
  const role = roles.get(/\.(\d+)\.\d+\.\d+\.cpuprofile$/.exec(file)?.[1] ?? "") ?? "";
  console.log(
    `== ${role} ${file}: ${((total - idle) / calls).toFixed(1)} µs of CPU per call (sampled)`,
  );
  for (const [k, v] of [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, Number(flags.top)))
    console.log(`${((v / (total - idle)) * 100).toFixed(1).padStart(5)}%  ${k}`);
  console.log("");
}
process.exit(0);
