// The owner-account path against the mesh-account path (docs/adr/0041), in the same run: one
// mesh whose executor is the mesh account's `executor`, one whose executor lives in tool owner
// bench's account (pulls, acks, records and final messages through the owner's crossings), both
// on a server with the accounts `toolmesh auth config --owner bench=echo` generates. Rounds
// alternate the paths, so machine noise falls on all. `plain` adds the same mesh on a server with
// one account and no users, so the accounts' own cost shows too. Prints p50, throughput at
// `--in-flight` and the server's messages per call, each path's and its ratio to the mesh path's.
// `npm run build` first.
// Usage: node bench/owner.mjs [--rounds 2] [--calls 300] [--seconds 5] [--paths plain,mesh,owner]
import { loadavg } from "node:os";
import { parseArgs } from "node:util";
import { startMesh } from "./lib/systems.mjs";
import { closedLoop, costPerCall, round, sequential, snapshot } from "./lib/measure.mjs";

const { values: flags } = parseArgs({
  options: {
    rounds: { type: "string", default: "2" },
    calls: { type: "string", default: "300" },
    seconds: { type: "string", default: "5" },
    "in-flight": { type: "string", default: "32" },
    paths: { type: "string", default: "mesh,owner" },
  },
});
const payload = { text: "x".repeat(256) };
const paths = flags.paths.split(",");
if (!paths.includes("mesh") || paths.some((p) => !["plain", "mesh", "owner"].includes(p))) {
  throw new Error("--paths: a list of plain, mesh and owner that includes mesh");
}
const results = Object.fromEntries(paths.map((p) => [p, []]));

for (let round_ = 0; round_ < Number(flags.rounds); round_++) {
  for (const path of paths) {
    const accounts = path === "plain" ? undefined : path;
    const mesh = await startMesh({ name: path, accounts });
    try {
      for (let i = 0; i < 50; i++) await mesh.call(payload); // warm-up
      const before = await snapshot(mesh);
      const one = await sequential((p) => mesh.call(p), Number(flags.calls), payload);
      const after = await snapshot(mesh);
      const loop = await closedLoop((p) => mesh.call(p), {
        inFlight: Number(flags["in-flight"]),
        durationMs: Number(flags.seconds) * 1000,
        payload,
      });
      const cost = costPerCall(before, after, Number(flags.calls));
      results[path].push({
        p50_ms: one.p50_ms,
        calls_per_s: loop.calls_per_s,
        msgs_per_call: round(cost.server_in_msgs_per_call + cost.server_out_msgs_per_call, 2),
      });
    } finally {
      await mesh.stop();
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const of = (path, key) => median(results[path].map((r) => r[key]));
const summary = {};
for (const key of ["p50_ms", "calls_per_s", "msgs_per_call"]) {
  summary[key] = Object.fromEntries(paths.map((p) => [p, of(p, key)]));
  for (const p of paths.filter((p) => p !== "mesh")) {
    summary[key][`${p}_to_mesh`] = round(of(p, key) / of("mesh", key), 2);
  }
}
console.log(
  JSON.stringify({ rounds: results, summary, load_average: loadavg().map((x) => round(x, 2)) }),
);
