import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readFileSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { SessionEvent } from "@toolmesh/client";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startLedgerMesh } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";

let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let executor: ServiceProcess;
let ledgerDir: string;

beforeAll(async () => {
  server = await startNatsServer();
  ({ resolver, executor, ledgerDir } = await startLedgerMesh(server.url, "sleepy"));
  nc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  client = new ToolmeshClient(nc, { deadlineGraceMs: 10_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
  rmSync(ledgerDir, { recursive: true, force: true });
});

/**
 * Resolves once the restarted server has a client connection of each named service (its
 * connection name, `toolmesh-<service>`): it started with none, so each one reconnected.
 */
async function reconnected(...names: string[]): Promise<void> {
  const connected = async (): Promise<string[]> => {
    const res = await fetch(`${server.monitorUrl}/connz?limit=1024`);
    const connz = (await res.json()) as { connections?: { name?: string }[] };
    return (connz.connections ?? []).flatMap((c) => (c.name === undefined ? [] : [c.name]));
  };
  await expect
    .poll(
      async () => {
        const now = await connected();
        return names.every((name) => now.includes(name));
      },
      { timeout: 20_000, interval: 50 },
    )
    .toBe(true);
}

/** Calls delivered to the resolvers and not acknowledged: being routed, or held. */
async function unacknowledgedCalls(): Promise<number> {
  const res = await fetch(`${server.monitorUrl}/jsz?accounts=true&consumers=true`);
  const jsz = (await res.json()) as {
    account_details?: {
      stream_detail?: {
        name: string;
        consumer_detail?: { name: string; num_ack_pending: number }[];
      }[];
    }[];
  };
  const consumers = (jsz.account_details ?? []).flatMap((a) =>
    (a.stream_detail ?? []).flatMap((s) =>
      s.name === "TOOLMESH_CALLS" ? (s.consumer_detail ?? []) : [],
    ),
  );
  return consumers.find((c) => c.name === "resolver")?.num_ack_pending ?? 0;
}

function executions(key: string): number {
  const name = encodeURIComponent(key);
  return readdirSync(ledgerDir).includes(name)
    ? readFileSync(join(ledgerDir, name), "utf8").split("\n").filter(Boolean).length
    : 0;
}

describe("a NATS server killed and restarted", () => {
  it("loses no accepted call: in flight, queued and submitted while it was down all end with their result", async () => {
    const session = client.session("restart-1");
    const started = new Promise<void>((resolve) => {
      const stop = session.onEvent((e: SessionEvent) => {
        if (e.type === "progress" && e.event.tool_call_id === "r0") {
          stop();
          resolve();
        }
      });
    });
    const running = session.submit(
      { id: "r0", name: "sleepy", arguments: { ms: 1_500 } },
      { timeoutMs: 30_000 },
    );
    const queued = Array.from({ length: 5 }, (_, i) =>
      session.submit(
        { id: `r${i + 1}`, name: "sleepy", arguments: { ms: 50 } },
        { timeoutMs: 30_000 },
      ),
    );
    await started;
    await server.kill();
    // Submitted while nothing answers: the client keeps publishing with the same message id.
    const whileDown = session.submit(
      { id: "r9", name: "sleepy", arguments: { ms: 10 } },
      { timeoutMs: 30_000 },
    );
    await server.restart();
    await reconnected("toolmesh-resolver", "toolmesh-executor");
    const messages = await Promise.all([running, ...queued, whileDown].map((h) => h.result));
    session.close();
    expect(messages.map((m) => m.error?.code ?? "ok")).toEqual(Array(7).fill("ok"));
    // A killed server may lose its last acknowledgements: a call can run again (side effects
    // are at-least-once across crashes; handlers get the idempotency key), never lose its end.
    for (const id of ["r1", "r2", "r3", "r4", "r5", "r9"]) {
      expect(executions(`default/restart-1/restart-1/${id}`)).toBeGreaterThanOrEqual(1);
      expect(executions(`default/restart-1/restart-1/${id}`)).toBeLessThanOrEqual(2);
    }
    expect(resolver.child.exitCode).toBeNull();
    expect(executor.child.exitCode).toBeNull();
  });

  it("answers a resubmission from the stored result after a restart made the duplicate window forget", async () => {
    const first = client.session("restart-2");
    const original = await first.submit({ id: "s1", name: "sleepy", arguments: { ms: 5 } }).result;
    first.close();
    await server.kill();
    await server.restart();
    await reconnected("toolmesh-resolver");
    const again = client.session("restart-2");
    const repeated = await again.submit({ id: "s1", name: "sleepy", arguments: { ms: 5 } }).result;
    again.close();
    expect(repeated.content).toBe(original.content);
    expect(executions("default/restart-2/restart-2/s1")).toBe(1);
  });
});

describe("calls held for their fair turn and delivered again", () => {
  it("hands each on once, and leaves no slot of the window taken once they ended", async () => {
    const session = client.session("held-again");
    // The ledger mesh's executor runs 16 at once (its announced capacity, the window): 32 wait.
    const first = Array.from({ length: 48 }, (_, i) =>
      session.submit(
        { id: `h${i}`, name: "sleepy", arguments: { ms: 1_000 } },
        { timeoutMs: 60_000 },
      ),
    );
    // Held calls are deliveries of the calls stream the resolver has not acknowledged.
    await expect.poll(unacknowledgedCalls, { timeout: 10_000, interval: 20 }).toBeGreaterThan(16);
    // Its heartbeats stop for longer than the ack wait (1 s), as when its connection is down
    // while the server is up: the server delivers the held calls again.
    process.kill(resolver.child.pid as number, "SIGSTOP");
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    process.kill(resolver.child.pid as number, "SIGCONT");
    const firstResults = await Promise.all(first.map((h) => h.result));
    expect(firstResults.map((m) => m.error?.code ?? "ok")).toEqual(Array(48).fill("ok"));
    // A second copy of a held call, handed on after the call ended, would count as running with
    // no final message to come and keep its slot until its deadline (60 s): these would wait.
    const later = Array.from({ length: 32 }, (_, i) =>
      session.submit(
        { id: `l${i}`, name: "sleepy", arguments: { ms: 100 } },
        { timeoutMs: 15_000 },
      ),
    );
    const laterResults = await Promise.all(later.map((h) => h.result));
    session.close();
    expect(laterResults.map((m) => m.error?.code ?? "ok")).toEqual(Array(32).fill("ok"));
  }, 90_000);
});

describe("a NATS server restarted cleanly (SIGTERM) under load", () => {
  const RESTARTS = 3;
  const RATE_PER_S = 60;
  const CALLS = 480;
  // What the session has submitted and not yet had answered, at most, as an agent that waits
  // for its answers: below the resolver's per-session in-flight limit (256), however long a
  // restart takes and however much of it waits in the streams meanwhile.
  const OUTSTANDING = 64;

  it("re-runs no handler that had finished", async () => {
    const session = client.session("restart-3");
    const handles: ReturnType<typeof session.submit>[] = [];
    const started = performance.now();
    let restarts = Promise.resolve();
    for (let i = 0; i < CALLS; i++) {
      const due = started + (i * 1_000) / RATE_PER_S;
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, due - performance.now())));
      if (i >= OUTSTANDING) await handles[i - OUTSTANDING]?.result;
      handles.push(
        session.submit(
          { id: `t${i}`, name: "sleepy", arguments: { ms: 150 } },
          { timeoutMs: 30_000 },
        ),
      );
      // Restarts spread over the submission, each once the previous one is done.
      if (i > 0 && i % Math.floor(CALLS / (RESTARTS + 1)) === 0 && i < CALLS - 10)
        restarts = restarts.then(() => server.restart());
    }
    await restarts;
    const messages = await Promise.all(handles.map((h) => h.result));
    session.close();
    // Named, so a failure says which limit or fault answered.
    expect(
      messages.flatMap((m) =>
        m.error === undefined ? [] : [`${m.tool_call_id}: ${m.error.code}: ${m.error.message}`],
      ),
    ).toEqual([]);
    const reruns = Array.from(
      { length: CALLS },
      (_, i) => executions(`default/restart-3/restart-3/t${i}`) - 1,
    );
    const total = reruns.reduce((a, b) => a + b, 0);
    console.log(
      `${RESTARTS} clean restarts at ${RATE_PER_S} calls/s: ${total} handler re-runs ` +
        `(${(total / RESTARTS).toFixed(1)} per restart)`,
    );
    // Each handler ran once: finished outcomes are recorded across the restart, not dropped.
    expect(total).toBe(0);
  }, 90_000);
});
