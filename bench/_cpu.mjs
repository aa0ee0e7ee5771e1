import { readFileSync, readdirSync } from "node:fs";
import { jetstreamManager } from "@nats-io/jetstream";
import { createSubjects } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import { closedLoop } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";
const side = process.argv[2];
const mesh = await startMesh({
  name: side,
  ...(process.env.PROF && { nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${process.env.PROF}`] }),
  ...(side === "on" && {
    env: { TOOLMESH_AUDIT: "required" },
    prepare: async (nc) =>
      ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(createSubjects(), "default")),
  }),
});
const tick = 100;
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
if (side === "policy") {
  const policies = [];
  for (let i = 0; i < 46; i++)
    policies.push(
      `@id("tenant-${i}") permit (principal == Toolmesh::Tenant::"t${i}", action, resource) when { context has agent && context.agent == "a${i}" };`,
    );
  policies.push(
    `@id("read-only") permit (principal, action, resource) when { resource.annotations has readOnlyHint && resource.annotations.readOnlyHint };`,
    `@id("builtin") permit (principal, action in [Toolmesh::Action::"call", Toolmesh::Action::"list"], resource) when { resource.kind == "native" };`,
    `@id("wipe-needs-approval") @approval("operator") permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"wipe");`,
    `@id("no-secrets") forbid (principal, action == Toolmesh::Action::"call", resource) when { context.args has text && context.args.text like "*password*" };`,
  );
  const store = new PolicyStore(await openPolicyBucket(mesh.nc, { subjects: createSubjects() }));
  await store.set(policies.join("\n"));
  for (;;) {
    const refused = await mesh.submit("echo", { text: "password" }).then(
      () => false,
      (e) => e.code === "permission_denied",
    );
    if (refused) break;
  }
}
function cpu() {
  const out = {};
  for (const pid of readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
    let cmd;
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
    } catch {
      continue;
    }
    const name = cmd.includes("nats-server") ? "server" : cmd.match(/services\/([a-z-]+)\//)?.[1];
    if (!name) continue;
    const st = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
    out[name] = (out[name] ?? 0) + ((Number(st[11]) + Number(st[12])) * 1000) / tick;
  }
  const s = readFileSync(`/proc/self/stat`, "utf8").split(") ")[1].split(" ");
  out.bench = ((Number(s[11]) + Number(s[12])) * 1000) / tick;
  return out;
}
const payload = { text: "x".repeat(64) };
await closedLoop((p) => mesh.call(p), { durationMs: 2000, inFlight: 64, payload });
const a = cpu();
const r = await closedLoop((p) => mesh.call(p), { durationMs: 10000, inFlight: 64, payload });
const b = cpu();
const n = r.calls;
delete r.hist;
console.log(side, JSON.stringify(r).slice(0, 200));
for (const k of Object.keys(b))
  console.log(k, (((b[k] - (a[k] ?? 0)) / n) * 1000).toFixed(1), "us/call");
await mesh.stop();
