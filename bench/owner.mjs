// The owner-account path against the mesh-account path (docs/adr/0041), in the same run: one
// mesh whose executor is the mesh account's `executor`, one whose executor lives in tool owner
// bench's account (pulls, acks, records and final messages through the owner's crossings), both
// on a server with the accounts `toolmesh auth config --owner bench=echo` generates. Rounds
// alternate the paths, so machine noise falls on all. `plain` adds the same mesh on a server with
// one account and no users, so the accounts' own cost shows too. Prints p50, throughput at
// `--in-flight` and the server's messages per call, each path's and its ratio to the mesh path's.
// `--tap` then starts each path once more and counts the messages of `--calls` calls by subject
// (ids folded to `#` and `*`) in the mesh account and in the owner's, a message that crosses
// an import counted in both: which messages one path has that the other has not.
// `npm run build` first.
// Usage: node bench/owner.mjs [--rounds 2] [--calls 300] [--seconds 5] [--paths plain,mesh,owner]
//        [--tap]
import { loadavg } from "node:os";
import { benchFlags } from "./lib/flags.mjs";
import { connect } from "@nats-io/transport-node";
import { Defaults } from "@toolmesh/protocol";
import { startMesh } from "./lib/systems.mjs";
import { closedLoop, costPerCall, median, round, sequential, snapshot } from "./lib/measure.mjs";

const { values: flags } = benchFlags({
  options: {
    rounds: { type: "string", default: "2" },
    calls: { type: "string", default: "300" },
    seconds: { type: "string", default: "5" },
    "in-flight": { type: "string", default: "32" },
    paths: { type: "string", default: "mesh,owner" },
    tap: { type: "boolean", default: false },
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

const of = (path, key) => median(results[path].map((r) => r[key]));
const summary = {};
for (const key of ["p50_ms", "calls_per_s", "msgs_per_call"]) {
  summary[key] = Object.fromEntries(paths.map((p) => [p, of(p, key)]));
  for (const p of paths.filter((p) => p !== "mesh")) {
    summary[key][`${p}_to_mesh`] = round(of(p, key) / of("mesh", key), 2);
  }
}
const taps = flags.tap ? {} : undefined;
for (const path of taps === undefined ? [] : paths.filter((p) => p !== "plain")) {
  taps[path] = await tapPath(path);
}
console.log(
  JSON.stringify({
    rounds: results,
    summary,
    ...(taps === undefined ? {} : { messages_per_call_by_subject: taps }),
    load_average: loadavg().map((x) => round(x, 2)),
  }),
);

/** A subject with its call, session and sequence tokens folded, and any inbox or `_R_` tail. */
function shape(subject) {
  return subject
    .split(".")
    .map((t) => (/^\d+$/.test(t) ? "#" : /^bench-\d+$/.test(t) ? "*" : t))
    .join(".")
    .replace(/^(_INBOX\.toolmesh\.[a-z-]+(\.bench)?)\..*$/, "$1.…")
    .replace(/^_R_\..*$/, "_R_.…")
    .replace(/^(\$KV\.[^.]+)\..*$/, "$1.…");
}

/** Messages per call by account, subject and reply subject, once the executor trusts its work. */
async function tapPath(path) {
  const mesh = await startMesh({ name: path, accounts: path });
  const counts = {};
  const taps = [];
  try {
    for (let i = 0; i < 50; i++) await mesh.call(payload); // warm-up
    // Past the window in which an executor reads the record of fresh work (ADR 0027).
    await new Promise((resolve) => setTimeout(resolve, Defaults.freshWorkWindowMs + 500));
    for (const [user, account] of [
      ["driver", "TOOLMESH"],
      ["tap", "OWNER_bench"],
    ]) {
      const nc = await connect({ servers: mesh.server.url, user, pass: user });
      nc.subscribe(">", {
        callback: (_err, msg) => {
          const key = `${account} ${shape(msg.subject)}${msg.reply ? ` reply ${shape(msg.reply)}` : ""}`;
          counts[key] = (counts[key] ?? 0) + 1;
        },
      });
      await nc.flush();
      taps.push(nc);
    }
    const calls = Number(flags.calls);
    await sequential((p) => mesh.call(p), calls, payload);
    for (const nc of taps) await nc.flush();
    return Object.fromEntries(
      Object.entries(counts)
        .map(([key, n]) => [key, round(n / calls, 2)])
        .filter(([, n]) => n >= 0.05)
        .sort((a, b) => b[1] - a[1]),
    );
  } finally {
    for (const nc of taps) await nc.close();
    await mesh.stop();
  }
}
