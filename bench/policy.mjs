// The call path with a 50-policy Cedar set against no policy, in one run:
// `node bench/policy.mjs [--smoke] [--cpu-prof DIR]` (--cpu-prof writes each service's CPU profile
// to DIR when it stops).
//
// One mesh (resolver, executor, echo). Phases alternate in pairs (4, or 2 with --smoke): no
// policy set and the 50-policy set stored as the operator's; each phase measures sequential
// calls (p50) and a closed loop of 64 in flight (throughput); the ratios printed are the
// medians of the pairs' ratios. The set makes every
// decision depend on the arguments (a forbid reads `context.args`), so each call is evaluated
// in full: the worst case of the decision cache. Prints one JSON line with both sides and the
// ratios; one of the 50 is an `@approval` permit for another tool, so the calls measured pay for
// an approvals policy being present. Aim: throughput ≥ 0.9 of no policy, p50 at most 0.2 ms more.
import { benchFlags } from "./lib/flags.mjs";
import { createSubjects } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { fastest, median, phase, round } from "./lib/measure.mjs";
import { startMesh } from "./lib/systems.mjs";

const { values: flags } = benchFlags({
  options: { smoke: { type: "boolean", default: false }, "cpu-prof": { type: "string" } },
});
const log = (...a) => process.stderr.write(`${a.join(" ")}\n`);
const SEQUENTIAL = flags.smoke ? 300 : 2_000;
const LOOP_MS = flags.smoke ? 3_000 : 10_000;

const policies = [];
for (let i = 0; i < 46; i++)
  policies.push(
    `@id("tenant-${i}") permit (principal == Toolmesh::Tenant::"t${i}", action, resource) when { context has agent && context.agent == "a${i}" };`,
  );
policies.push(
  `@id("read-only") permit (principal, action, resource) when { resource.annotations has readOnlyHint && resource.annotations.readOnlyHint };`,
  `@id("builtin") permit (principal, action in [Toolmesh::Action::"call", Toolmesh::Action::"list"], resource) when { resource.kind == "native" };`,
  // An approvals policy in the set: a destructive tool waits for the operator; the calls measured
  // need no approval, so this is what its presence costs them.
  `@id("wipe-needs-approval") @approval("operator") permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"wipe");`,
  `@id("no-secrets") forbid (principal, action == Toolmesh::Action::"call", resource) when { context.args has text && context.args.text like "*password*" };`,
);
const SET = policies.join("\n");

const mesh = await startMesh({
  name: "policy",
  nodeArgs: flags["cpu-prof"] ? ["--cpu-prof", `--cpu-prof-dir=${flags["cpu-prof"]}`] : [],
});
const store = new PolicyStore(await openPolicyBucket(mesh.nc, { subjects: createSubjects() }));
const payload = { text: "x".repeat(64) };

/** Stores (or removes) the set and waits until a call shows the resolver applies it. */
async function apply(withPolicy) {
  if (withPolicy) await store.set(SET);
  else await store.rm();
  for (;;) {
    const refused = await mesh.submit("echo", { text: "password" }).then(
      () => false,
      (err) => err.code === "permission_denied",
    );
    if (refused === withPolicy) return;
  }
}

// Pairs of phases, in the order none-policy then policy-none, so that a drift of the machine
// over the run weighs on both sides alike; each pair gives one throughput ratio, and the verdict
// is their median (one noisy phase moves one pair, not the result).
const PAIRS = flags.smoke ? 2 : 4;
const results = { none: [], policy: [] };
const pairRatios = [];
try {
  for (let pair = 0; pair < PAIRS; pair++) {
    const order = pair % 2 === 0 ? ["none", "policy"] : ["policy", "none"];
    const measured = {};
    for (const side of order) {
      await apply(side === "policy");
      measured[side] = await phase((p) => mesh.call(p), {
        label: side,
        sequentialCalls: SEQUENTIAL,
        loopMs: LOOP_MS,
        payload,
        log,
        system: mesh,
      });
      results[side].push(measured[side]);
    }
    pairRatios.push({
      throughput: measured.policy.calls_per_s / measured.none.calls_per_s,
      p50_added_ms: measured.policy.p50_ms - measured.none.p50_ms,
    });
  }
} finally {
  await mesh.stop();
}
const best = (side, key, pick) => pick(...results[side].map((r) => r[key]));
console.log(
  JSON.stringify({
    bench: "policy",
    policies: policies.length,
    pairs: PAIRS,
    throughput_ratio: round(median(pairRatios.map((r) => r.throughput))),
    p50_added_ms: round(median(pairRatios.map((r) => r.p50_added_ms))),
    pair_throughput_ratios: pairRatios.map((r) => round(r.throughput)),
    best: {
      none: {
        p50_ms: best("none", "p50_ms", Math.min),
        calls_per_s: best("none", "calls_per_s", Math.max),
        cpu_us_by_process: fastest(results.none).cpu_us_by_process,
      },
      policy: {
        p50_ms: best("policy", "p50_ms", Math.min),
        calls_per_s: best("policy", "calls_per_s", Math.max),
        cpu_us_by_process: fastest(results.policy).cpu_us_by_process,
      },
    },
  }),
);
