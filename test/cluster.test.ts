/**
 * The mesh on a real 3-node NATS cluster with every stream and bucket replicated 3 times:
 * `toolmesh setup` provisions it; resolvers, executors and the frontend are given every node's
 * URL; under steady load the node leading the calls, work and call-record streams is SIGKILLed
 * and restarted, a leader is moved on purpose, and another node is SIGKILLed. Then the cluster
 * goes through a rolling restart under load, its nodes stopped in turn through lame-duck mode
 * and by SIGTERM. Checks guarantees 1–3 of the design (exactly one final message by the deadline, nothing
 * lost, side effects once per idempotency key) and prints the figures.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import type { CallHandle } from "@toolmesh/client";
import type { NatsClusterHandle } from "@toolmesh/nats-launcher";
import {
  stepDownStreamLeader,
  stopAll,
  streamLeader,
  waitForStreamLeader,
} from "@toolmesh/nats-launcher";
import { CallStore } from "@toolmesh/call-store";
import { Header, callKey, createSubjects, decodeJsonOrUndefined } from "@toolmesh/protocol";
import type { SessionAddress, ToolMessage } from "@toolmesh/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { readLedgers } from "./helpers/ledgers.js";
import { startTestCluster } from "./helpers/nats-server.js";

/**
 * Seconds of load and calls per second. CI runs 24 s at 50/s on two shared cores; the figures in
 * docs/architecture.md come from `CLUSTER_LOAD_SECONDS=60 CLUSTER_LOAD_RATE=100`.
 */
const LOAD_SECONDS = Number(process.env.CLUSTER_LOAD_SECONDS ?? 24);
const RATE_PER_S = Number(process.env.CLUSTER_LOAD_RATE ?? 50);
const SESSIONS = 16;
/** Long enough that every deadline falls after the last fault has been recovered from. */
const TIMEOUT_MS = 60_000;
/** The design's "small grace" after a deadline, on a machine whose cores are shared. */
const DEADLINE_GRACE_MS = 2_000;
const ACK_WAIT_MS = 2_000;
const TOOL = "ledger_append";
/** Calls per second through the rolling restarts, and how long each node stays down. */
const ROLLING_RATE_PER_S = 40;
const ROLLING_DOWN_MS = 1_000;
/**
 * Loose bounds on the latency of calls submitted during a rolling restart, for two cores shared
 * with other builds (a load average of 25 stretches even a fault-free p99 to seconds). They catch
 * the chained 5 s JetStream timeouts and consumer checks that used to stall calls for 10–15 s;
 * the targets (p99 1 s, max 3 s) are measured by `bench/rolling-restart.mjs`
 * (docs/architecture.md, "Rolling restarts and upgrades").
 */
const ROLLING_P99_MS = 10_000;
const ROLLING_MAX_MS = 15_000;

let cluster: NatsClusterHandle;
let nc: NatsConnection;
let workDir: string;
let env: Record<string, string>;
let ledgerDir: string;
let execDir: string;

interface SetupReport {
  changed: number;
  resources: { kind: string; name: string; action: string }[];
}

async function setup(extra: Record<string, string>): Promise<SetupReport> {
  const out = await runCli(["setup", "--json"], { NATS_URL: cluster.urls, ...extra });
  expect(out.stderr).toBe("");
  expect(out.code).toBe(0);
  return JSON.parse(out.stdout) as SetupReport;
}

const now = (): number => performance.now();

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? NaN;
}

/**
 * What the mesh kept of a call that failed, to say which path lost it: its final message in the
 * sessions stream (stored: the frontend missed it; none: the mesh never ended the call), whether
 * its submission still waits in the calls stream, and the services' log lines about it.
 */
async function whatBecameOf(
  services: Record<string, ServiceProcess>,
  address: SessionAddress,
  callId: string,
): Promise<string> {
  const subjects = createSubjects();
  const jsm = await jetstreamManager(nc);
  const stored = await jsm.direct
    .getMessage(subjects.streams.sessions, { last_by_subj: subjects.result(address, callId) })
    .then(
      (m) => {
        if (m === null) return "none";
        const message = decodeJsonOrUndefined(m.data) as ToolMessage | undefined;
        return `${message?.error?.code ?? "ok"} (stream seq ${m.seq})`;
      },
      (err: unknown) => `unread (${String(err)})`,
    );
  const waiting = await waitingCallIds().then(
    (ids) => (ids.has(callId) ? "yes" : "no"),
    (err: unknown) => `unread (${String(err)})`,
  );
  const record = await CallStore.bind(nc, subjects)
    .then((store) => store.get({ address, idempotency_key: callId }))
    .then(
      (r) => (r === undefined ? "none" : `${r.record.state} (revision ${r.revision})`),
      (err: unknown) => `unread (${String(err)})`,
    );
  const work = await workSeqs(callKey(address, callId)).then(
    (seqs) => (seqs.length === 0 ? "none" : `at ${seqs.join(", ")}`),
    (err: unknown) => `unread (${String(err)})`,
  );
  // In the order they were logged, each with its error: which step failed, and why.
  const at = (l: Record<string, unknown>): number => new Date(l.time as string | number).getTime();
  const trail = Object.entries(services)
    .flatMap(([name, service]) =>
      service.lines.filter((l) => l.callId === callId).map((l) => ({ name, l, t: at(l) })),
    )
    .sort((a, b) => a.t - b.t)
    .map(({ name, l, t }) => {
      const err = (l.err as { message?: unknown } | undefined)?.message;
      const why = typeof err === "string" ? ` (${err.slice(0, 200)})` : "";
      const seq =
        typeof l.seq === "number" ? ` seq ${l.seq}${l.duplicate === true ? " duplicate" : ""}` : "";
      const when = Number.isNaN(t) ? "" : ` ${new Date(t).toISOString().slice(11, 23)}`;
      return `${name}${when}: ${String(l.msg)}${seq}${why}`;
    });
  return `stored ${stored}; still in the calls stream ${waiting}; record ${record}; work ${work}; logged ${trail.length === 0 ? "nothing" : trail.join(" | ")}`;
}

/** The work stream's sequences of the work of call `key` still there. */
async function workSeqs(key: string): Promise<number[]> {
  const subjects = createSubjects();
  const jsm = await jetstreamManager(nc);
  const { state } = await jsm.streams.info(subjects.streams.work);
  const seqs: number[] = [];
  if (state.messages > 5_000) return seqs;
  for (let seq = state.first_seq; seq <= state.last_seq && state.messages > 0; seq++) {
    const m = await jsm.streams.getMessage(subjects.streams.work, { seq }).catch(() => null);
    if (m?.header.get(Header.CallKey) === key) seqs.push(seq);
  }
  return seqs;
}

/** The call ids of the submissions the calls stream still holds (not yet taken by a resolver). */
async function waitingCallIds(): Promise<Set<string>> {
  const subjects = createSubjects();
  const jsm = await jetstreamManager(nc);
  const { state } = await jsm.streams.info(subjects.streams.calls);
  const ids = new Set<string>();
  if (state.messages > 5_000) return ids;
  for (let seq = state.first_seq; seq <= state.last_seq; seq++) {
    const m = await jsm.direct.getMessage(subjects.streams.calls, { seq }).catch(() => null);
    const request = m && (decodeJsonOrUndefined(m.data) as { tool_call?: { id?: string } });
    if (request?.tool_call?.id !== undefined) ids.add(request.tool_call.id);
  }
  return ids;
}

/** The services of a test by name (`resolver-0`, `executor-1`…), for {@link whatBecameOf}. */
function named(list: Record<string, ServiceProcess[]>): Record<string, ServiceProcess> {
  return Object.fromEntries(
    Object.entries(list).flatMap(([kind, services]) =>
      services.map((service, i) => [`${kind}-${i}`, service] as const),
    ),
  );
}

/** A fresh 3-node cluster on the chosen nats-server. */
function startCluster(): Promise<NatsClusterHandle> {
  return startTestCluster({
    size: 3,
    // The NATS Helm chart's lame-duck duration, with a shorter grace period than its 10 s to
    // keep the test short: the mesh's connections leave a lame duck at once either way.
    config: "lame_duck_duration: 30s\nlame_duck_grace_period: 2s\n",
  });
}

beforeAll(async () => {
  cluster = await startCluster();
  workDir = mkdtempSync(join(tmpdir(), "toolmesh-cluster-"));
  // The frontend connects as the gateway and the services do, following server restarts.
  nc = await connectNats({ servers: cluster.urls, name: "cluster-test" });
}, 60_000);

afterAll(async () => {
  await nc?.close().catch(() => undefined);
  await killAllServices();
  await cluster?.stop();
  await stopAll();
  if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
});

describe("toolmesh setup on a cluster", () => {
  it("provisions a fresh cluster, finds nothing to change again, and changes the replica count", async () => {
    const resize = { TOOLMESH_PREFIX: "resize" };
    const first = await setup({ ...resize, TOOLMESH_STREAM_REPLICAS: "1" });
    expect(first.changed).toBe(19);
    expect((await setup({ ...resize, TOOLMESH_STREAM_REPLICAS: "1" })).changed).toBe(0);
    const grown = await setup({ ...resize, TOOLMESH_STREAM_REPLICAS: "3" });
    // Six streams and nine buckets change; consumers follow their stream.
    expect(grown.changed).toBe(16);
    expect(grown.resources.filter((r) => r.action === "updated").map((r) => r.kind)).not.toContain(
      "consumer",
    );
    expect((await setup({ ...resize, TOOLMESH_STREAM_REPLICAS: "3" })).changed).toBe(0);
    const replicas = await new Promise<number | undefined>((resolve, reject) => {
      nc.request("$JS.API.STREAM.INFO.RESIZE_CALLS").then(
        (m) => resolve(m.json<{ config: { num_replicas: number } }>().config.num_replicas),
        reject,
      );
    });
    expect(replicas).toBe(3);
  });
});

describe("the mesh on a 3-node cluster with replicas 3", () => {
  it(`keeps every call through leader kills and a step-down at ${RATE_PER_S} calls/s`, async () => {
    const subjects = createSubjects();
    ledgerDir = join(workDir, "ledger");
    execDir = join(workDir, "exec");
    mkdirSync(ledgerDir);
    mkdirSync(execDir);
    env = {
      NATS_URL: cluster.urls,
      TOOLMESH_STREAM_REPLICAS: "3",
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-fault"),
      TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir, execDir }),
      TOOLMESH_ACK_WAIT_MS: String(ACK_WAIT_MS),
      TOOLMESH_CONCURRENCY: "64",
    };
    expect((await setup(env)).changed).toBe(19);
    const resolvers = await Promise.all([0, 1].map(() => startService("resolver", env)));
    const executors = await Promise.all([0, 1].map(() => startService("executor", env)));
    await Promise.all(resolvers.map((r) => toolAvailable(r, TOOL)));
    const services = named({ resolver: resolvers, executor: executors });

    // One node leads the three streams every call goes through: killing it hits all of them.
    const critical = [subjects.streams.calls, subjects.streams.work, `KV_${subjects.callsBucket}`];
    const target = "n1";
    for (const stream of critical) {
      for (let moves = 0; (await waitForStreamLeader(nc, stream)) !== target; moves++) {
        if (moves > 30) throw new Error(`${stream} never moved to ${target}`);
        await stepDownStreamLeader(nc, stream);
      }
    }

    const client = new ToolmeshClient(nc);
    const sessions = Array.from({ length: SESSIONS }, (_, i) => client.session(`cl-s${i}`));
    interface Tracked {
      id: string;
      address: SessionAddress;
      submittedAt: number;
      handle: CallHandle;
      live: { at: number; message: ToolMessage }[];
      settled?: { at: number; message: ToolMessage };
    }
    const calls = new Map<string, Tracked>();
    for (const session of sessions) {
      session.onEvent((event) => {
        if (event.type === "result")
          calls.get(event.message.tool_call_id)?.live.push({ at: now(), message: event.message });
      });
    }

    const started = now();
    const at = (ms: number): Promise<void> => sleep(Math.max(0, started + ms - now()));
    const faultLog: string[] = [];
    const stamp = (what: string): void => {
      faultLog.push(`${((now() - started) / 1000).toFixed(1)}s ${what}`);
    };
    const recovery: {
      what: string;
      at: number;
      leadersMs: number;
      /** Until the first final message of any call after the kill: how long results stalled. */
      stallMs?: number;
      /** Until the first final message of a call submitted after the kill. */
      newCallMs?: number;
    }[] = [];
    const loadMs = LOAD_SECONDS * 1_000;
    let stepDown: { at: number; ms: number } | undefined;

    const killLeader = async (what: string, node: string): Promise<void> => {
      const down = now();
      await cluster.node(node).kill();
      stamp(`SIGKILL ${node} (${what})`);
      await Promise.all(critical.map((stream) => waitForStreamLeader(nc, stream, 120_000, node)));
      recovery.push({ what: `SIGKILL ${node}`, leadersMs: now() - down, at: down });
      stamp(`new leaders for ${critical.join(", ")}`);
    };

    const faults = (async () => {
      await at(loadMs * 0.2);
      await killLeader("leader of calls, work and call records", target);
      await at(loadMs * 0.4);
      await cluster.node(target).restart();
      stamp(`${target} restarted`);
      // Under load the restarted node takes a while to catch up with every stream.
      // The next kill needs this node current; on a starved machine it may not be yet, which
      // the figures then show as a longer stall.
      await cluster.waitHealthy(30_000).then(
        () => stamp("cluster healthy (every stream and consumer current on every node)"),
        () => stamp("cluster not healthy after 30 s; going on"),
      );
      await at(loadMs * 0.55);
      const asked = now();
      const moved = await stepDownStreamLeader(nc, subjects.streams.calls);
      stepDown = { at: asked, ms: now() - asked };
      stamp(`step-down of ${subjects.streams.calls}: ${moved.from} -> ${moved.to}`);
      await at(loadMs * 0.7);
      const other = (await streamLeader(nc, subjects.streams.work)) ?? "n2";
      await killLeader(`leader of ${subjects.streams.work}`, other === target ? "n2" : other);
    })();
    faults.catch(() => undefined);

    const intervalMs = 1_000 / RATE_PER_S;
    const total = Math.round(LOAD_SECONDS * RATE_PER_S);
    for (let i = 0; i < total; i++) {
      await at(i * intervalMs);
      const id = `c${String(i).padStart(6, "0")}`;
      const session = sessions[i % SESSIONS];
      if (session === undefined) throw new Error("no session");
      const call: Tracked = {
        id,
        address: session.address,
        submittedAt: now(),
        handle: session.submit(
          { id, name: TOOL, arguments: { work_ms: 5 + ((i * 7919) % 26) } },
          { timeoutMs: TIMEOUT_MS },
        ),
        live: [],
      };
      calls.set(id, call);
      void call.handle.result.then((message) => {
        call.settled = { at: now(), message };
      });
    }
    const submitEnded = now();
    await faults;
    await Promise.all([...calls.values()].map((c) => c.handle.result));
    // Late or repeated final messages still count: listen a little longer.
    await sleep(2_000);
    for (const session of sessions) session.close();

    // Side effects by idempotency key (the ledger) and handler invocations by call.
    const { effects, invocations } = readLedgers(ledgerDir, execDir);

    const all = [...calls.values()];
    // What the mesh answered: live messages, or the stored one the client read after a
    // reconnect. The client's own answer when nothing came by the deadline does not count.
    const local = (m: ToolMessage): boolean => /^no answer within/.test(m.error?.message ?? "");
    const finals = (c: Tracked): { at: number; message: ToolMessage }[] => {
      const s = c.settled;
      if (s === undefined || local(s.message) || c.live.some((r) => r.message === s.message))
        return c.live;
      return [...c.live, s].sort((a, b) => a.at - b.at);
    };
    const answered = all.filter((c) => finals(c).some((f) => f.message.error === undefined));
    const failed = all.filter((c) => !answered.includes(c));
    const several = all.filter(
      (c) => new Set(finals(c).map((f) => JSON.stringify(f.message))).size > 1,
    );
    const late = all.filter((c) => {
      const first = finals(c)[0];
      return first === undefined || first.at - c.submittedAt > TIMEOUT_MS + DEADLINE_GRACE_MS;
    });
    const duplicated = [...effects.entries()].filter(([, n]) => n > 1);
    const withoutEffect = answered.filter((c) => !effects.has(c.id));
    const latencies = all
      .flatMap((c) => {
        const first = finals(c)[0];
        return first === undefined ? [] : [first.at - c.submittedAt];
      })
      .sort((a, b) => a - b);
    const totalInvocations = [...invocations.values()].reduce((a, b) => a + b, 0);
    const firstAfter = (list: Tracked[], t: number): number | undefined =>
      list
        .flatMap((c) => finals(c).map((f) => f.at))
        .filter((a) => a >= t)
        .sort((a, b) => a - b)[0];
    for (const r of recovery) {
      const stalled = firstAfter(all, r.at);
      const fresh = firstAfter(
        all.filter((c) => c.submittedAt >= r.at),
        r.at,
      );
      if (stalled !== undefined) r.stallMs = stalled - r.at;
      if (fresh !== undefined) r.newCallMs = fresh - r.at;
    }
    // Latency by phase of the run, to tell a stall after a fault from a slow machine.
    const marks = [
      started,
      ...[...recovery.map((x) => x.at), ...(stepDown === undefined ? [] : [stepDown.at])].sort(
        (a, b) => a - b,
      ),
      Infinity,
    ];
    const phases = marks.slice(0, -1).map((from, i) => {
      const to = marks[i + 1] ?? Infinity;
      const lat = all
        .filter((c) => c.submittedAt >= from && c.submittedAt < to)
        .flatMap((c) => {
          const first = finals(c)[0];
          return first === undefined ? [] : [first.at - c.submittedAt];
        })
        .sort((a, b) => a - b);
      return `${((from - started) / 1000).toFixed(1)}s: ${percentile(lat, 50).toFixed(0)}/${percentile(lat, 99).toFixed(0)}`;
    });
    const errors = new Map<string, number>();
    for (const c of failed) {
      const code = finals(c)[0]?.message.error?.code ?? "none";
      errors.set(code, (errors.get(code) ?? 0) + 1);
    }

    const rows: [string, string | number][] = [
      ["load (s) / rate (calls/s)", `${LOAD_SECONDS} / ${RATE_PER_S}`],
      ["submission took (s)", ((submitEnded - started) / 1000).toFixed(1)],
      ["calls accepted", all.length],
      ["answered with the tool's result", answered.length],
      ["lost or failed", `${failed.length} ${JSON.stringify(Object.fromEntries(errors))}`],
      ["more than one distinct final message", several.length],
      [`later than deadline + ${DEADLINE_GRACE_MS} ms`, late.length],
      ["side effects / duplicated", `${effects.size} / ${duplicated.length}`],
      [
        "deliveries per executed call (mean / max)",
        `${(totalInvocations / Math.max(1, invocations.size)).toFixed(3)} / ${Math.max(0, ...invocations.values())}`,
      ],
      [
        "latency p50 / p99 / max (ms)",
        `${percentile(latencies, 50).toFixed(0)} / ${percentile(latencies, 99).toFixed(0)} / ${(latencies.at(-1) ?? NaN).toFixed(0)}`,
      ],
      ["latency p50/p99 (ms) of calls submitted from", phases.join(", ")],
      ["step-down: new leader after (ms)", stepDown?.ms.toFixed(0) ?? "none"],
      ...recovery.map((r): [string, string] => [
        `after ${r.what}: new leaders / results flow / a new call answered (ms)`,
        [r.leadersMs, r.stallMs, r.newCallMs].map((v) => v?.toFixed(0) ?? "none").join(" / "),
      ]),
    ];
    const width = Math.max(...rows.map(([k]) => k.length));
    console.log(
      [
        "cluster test figures",
        ...several.slice(0, 5).map(
          (c) =>
            `  several ${c.id}: ${finals(c)
              .map(
                (f) =>
                  `${Math.round(f.at - c.submittedAt)}ms ${f.message.error?.code ?? "ok"} attempts=${String(f.message.attempts)} ${f.message.content.slice(0, 80)}`,
              )
              .join(" | ")}`,
        ),
        ...failed
          .slice(0, 5)
          .map(
            (c) =>
              `  failed ${c.id}: ${JSON.stringify(finals(c)[0]?.message.error ?? c.settled?.message.error)}`,
          ),
        ...faultLog.map((l) => `  fault ${l}`),
        ...rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`),
      ].join("\n"),
    );

    // Each failed call with what ended it and what the mesh kept of it, so a failure in CI says
    // which path lost it.
    const failure = async (c: Tracked): Promise<string> => {
      const error = finals(c)[0]?.message.error ?? c.settled?.message.error;
      const kept = await whatBecameOf(services, c.address, c.id);
      const ran = `handler ran ${invocations.get(c.id) ?? 0}x, effects ${effects.get(c.id) ?? 0}`;
      return `${c.id} ${error?.code ?? "none"}: ${error?.message ?? ""}; ${ran}; ${kept}`;
    };
    expect(await Promise.all(failed.slice(0, 10).map(failure))).toEqual([]);
    expect(several.map((c) => c.id)).toEqual([]);
    expect(late.map((c) => c.id)).toEqual([]);
    expect(duplicated).toEqual([]);
    expect(withoutEffect.map((c) => c.id)).toEqual([]);
  }, 240_000);

  it(`keeps calls moving through a rolling restart by SIGTERM and lame-duck mode at ${ROLLING_RATE_PER_S} calls/s`, async () => {
    // A rolling restart starts from a healthy cluster, as an upgrade does: the test before
    // leaves one node killed and another catching up, so this one gets a cluster and a mesh of
    // its own.
    await killAllServices();
    await nc.close();
    await cluster.stop();
    cluster = await startCluster();
    nc = await connectNats({ servers: cluster.urls, name: "cluster-test" });
    env = { ...env, NATS_URL: cluster.urls };
    expect((await setup(env)).changed).toBe(19);
    // Every new stream and consumer has its leader and replicas before the services read them.
    await cluster.waitHealthy(60_000);
    const resolvers = await Promise.all([0, 1].map(() => startService("resolver", env)));
    const executors = await Promise.all([0, 1].map(() => startService("executor", env)));
    await Promise.all(resolvers.map((r) => toolAvailable(r, TOOL)));
    const services = named({ resolver: resolvers, executor: executors });
    const client = new ToolmeshClient(nc);
    const sessions = Array.from({ length: SESSIONS }, (_, i) => client.session(`rr-s${i}`));
    type Mode = "SIGTERM" | "lame duck";
    interface Call {
      id: string;
      address: SessionAddress;
      at: number;
      result: Promise<ToolMessage>;
      done?: number;
      message?: ToolMessage;
      live: ToolMessage[];
    }
    const calls = new Map<string, Call>();
    for (const session of sessions) {
      session.onEvent((event) => {
        if (event.type === "result")
          calls.get(event.message.tool_call_id)?.live.push(event.message);
      });
    }
    const started = now();
    let loading = true;
    const load = (async () => {
      for (let i = 0; loading; i++) {
        await sleep(Math.max(0, started + (i * 1_000) / ROLLING_RATE_PER_S - now()));
        const id = `r${String(i).padStart(6, "0")}`;
        const session = sessions[i % SESSIONS];
        if (session === undefined) throw new Error("no session");
        const handle = session.submit(
          { id, name: TOOL, arguments: { work_ms: 5 + ((i * 7919) % 26) } },
          { timeoutMs: TIMEOUT_MS },
        );
        const call: Call = {
          id,
          address: session.address,
          at: now(),
          result: handle.result,
          live: [],
        };
        calls.set(id, call);
        void handle.result.then((message) => {
          call.done = now();
          call.message = message;
        });
      }
    })();
    // One rolling pass, as an upgrade runs: the nodes stop in turn, alternately through
    // lame-duck mode (the Helm chart's preStop) and by SIGTERM.
    const faultLog: string[] = [];
    const windows: { mode: Mode; from: number }[] = [];
    await sleep(2_000);
    for (const [i, node] of cluster.nodes.entries()) {
      const mode: Mode = i % 2 === 0 ? "lame duck" : "SIGTERM";
      // Calls submitted shortly before a fault are in flight when it hits.
      windows.push({ mode, from: now() - 1_000 });
      if (mode === "SIGTERM") await node.terminate();
      else await node.lameDuck();
      faultLog.push(`${((now() - started) / 1000).toFixed(1)}s ${node.name} ${mode}: exited`);
      await sleep(ROLLING_DOWN_MS);
      await node.restart();
      await cluster.waitHealthy(60_000);
      faultLog.push(`${((now() - started) / 1000).toFixed(1)}s ${node.name} back, cluster healthy`);
    }
    await sleep(2_000);
    loading = false;
    await load;
    await Promise.all([...calls.values()].map((c) => c.result));
    for (const session of sessions) session.close();

    const { effects, invocations } = readLedgers(ledgerDir, execDir);
    const all = [...calls.values()];
    const wrong = all.filter((c) => c.message?.error !== undefined || effects.get(c.id) !== 1);
    const several = all.filter((c) => new Set(c.live.map((m) => JSON.stringify(m))).size > 1);
    const figures = (["SIGTERM", "lame duck"] as const).map((mode) => {
      const inMode = all.filter((c) =>
        windows.some(
          (w, i) => w.mode === mode && c.at >= w.from && c.at < (windows[i + 1]?.from ?? Infinity),
        ),
      );
      const latencies = inMode.map((c) => (c.done ?? Infinity) - c.at).sort((a, b) => a - b);
      return {
        name: mode,
        calls: inMode.length,
        p50: percentile(latencies, 50),
        p99: percentile(latencies, 99),
        max: latencies.at(-1) ?? NaN,
        ranTwice: inMode.filter((c) => (invocations.get(c.id) ?? 0) > 1).length,
      };
    });
    console.log(
      [
        `a rolling restart at ${ROLLING_RATE_PER_S} calls/s, each node down ${ROLLING_DOWN_MS} ms`,
        ...faultLog.map((l) => `  fault ${l}`),
        ...figures.map(
          (f) =>
            `  ${f.name.padEnd(9)} calls ${f.calls}, p50/p99/max ${f.p50.toFixed(0)}/${f.p99.toFixed(0)}/${f.max.toFixed(0)} ms, handlers run twice ${f.ranTwice}`,
        ),
        `  wrong or lost ${wrong.length}, more than one distinct final message ${several.length}`,
      ].join("\n"),
    );

    expect(
      await Promise.all(
        wrong
          .slice(0, 10)
          .map(
            async (c) =>
              `${c.id} ${c.message?.error?.code ?? "ok"}, effects ${effects.get(c.id) ?? 0}; ${await whatBecameOf(services, c.address, c.id)}`,
          ),
      ),
    ).toEqual([]);
    expect(several.map((c) => c.id)).toEqual([]);
    for (const f of figures) {
      expect(f.p99, `${f.name} p99`).toBeLessThanOrEqual(ROLLING_P99_MS);
      expect(f.max, `${f.name} max`).toBeLessThanOrEqual(ROLLING_MAX_MS);
    }
  }, 300_000);
});
