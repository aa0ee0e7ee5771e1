// The owner-account path against the mesh-account path (docs/adr/0041), in the same run: one
// mesh whose executor is the mesh account's `executor`, one whose executor lives in tool owner
// bench's account (pulls, acks, records and final messages through the owner's crossings), both
// on a server with the accounts `toolmesh auth config --owner bench=echo` generates. Rounds
// alternate the two, so machine noise falls on both. Prints p50, throughput at `--in-flight`
// and the server's messages per call, each path's and the owner path's ratio to the mesh path's.
// `npm run build` first. Usage: node bench/owner.mjs [--rounds 2] [--calls 300] [--seconds 5]
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
  },
});
const payload = { text: "x".repeat(256) };
const results = { mesh: [], owner: [] };

for (let round_ = 0; round_ < Number(flags.rounds); round_++) {
  for (const accounts of ["mesh", "owner"]) {
    const mesh = await startMesh({ name: accounts, accounts });
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
      results[accounts].push({
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
  summary[key] = {
    mesh: of("mesh", key),
    owner: of("owner", key),
    owner_to_mesh: round(of("owner", key) / of("mesh", key), 2),
  };
}
console.log(
  JSON.stringify({ rounds: results, summary, load_average: loadavg().map((x) => round(x, 2)) }),
);
