import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { Session, SessionEvent } from "@toolmesh/client";
import { Defaults, createSubjects } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { until } from "./helpers/eventually.js";

let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let ledgerDir: string;
let env: Record<string, string>;
const executors: ServiceProcess[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  ledgerDir = mkdtempSync(join(tmpdir(), "toolmesh-ledger-"));
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    TOOLMESH_ACK_WAIT_MS: "1000",
  };
  // Calls wait in the work stream, where the executors' behaviour under test is: fair share
  // would hold a call at the resolver while the tool's one slot is busy (test/fair-share.test.ts).
  resolver = await startService("resolver", {
    ...env,
    TOOLMESH_SESSION_MAX_IN_FLIGHT: "2",
    TOOLMESH_FAIR_SHARE_WINDOW: "0",
  });
  nc = await connect({ servers: server.url });
  // A long local grace: every deadline answer in these tests must come from the mesh.
  client = new ToolmeshClient(nc, { deadlineGraceMs: 10_000 });
});

afterEach(async () => {
  await Promise.all(executors.splice(0).map((e) => e.kill()));
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
  rmSync(ledgerDir, { recursive: true, force: true });
});

async function executor(extra: Record<string, string> = {}): Promise<ServiceProcess> {
  const e = await startService("executor", { ...env, ...extra });
  executors.push(e);
  await toolAvailable(resolver, "sleepy");
  return e;
}

/** How many times the tool ran for an idempotency key. */
function executions(key: string): number {
  const file = join(ledgerDir, encodeURIComponent(key));
  return readdirSync(ledgerDir).includes(encodeURIComponent(key))
    ? readFileSync(file, "utf8").split("\n").filter(Boolean).length
    : 0;
}

/** Resolves with the pid of the executor once the call has started there. */
function startedOn(session: Session, callId: string): Promise<number> {
  return new Promise((resolve) => {
    const stop = session.onEvent((e: SessionEvent) => {
      if (e.type === "progress" && e.event.tool_call_id === callId) {
        stop();
        resolve((e.event.data as { pid: number }).pid);
      }
    });
  });
}

async function timed(result: Promise<ToolMessage>): Promise<{ message: ToolMessage; ms: number }> {
  const started = Date.now();
  const message = await result;
  return { message, ms: Date.now() - started };
}

/** Waits until the newest work message of `tool` holds the call `callId`: it waits, accepted. */
/** The call id of the last work message of `tool` still in the work stream, if any. */
async function lastWorkOf(tool: string): Promise<string | undefined> {
  const jsm = await jetstreamManager(nc);
  const subjects = createSubjects();
  const last = await jsm.streams.getMessage(subjects.streams.work, {
    last_by_subj: subjects.work(tool),
  });
  return last?.json<{ call_id: string }>().call_id;
}

async function queuedInWork(tool: string, callId: string): Promise<void> {
  await until(
    `${callId} to wait in the work stream`,
    async () => (await lastWorkOf(tool)) === callId,
    { timeoutMs: 30_000, everyMs: 20 },
  );
}

/** Waits until an executor took `callId`'s work and acknowledged it: it left the work stream. */
async function takenFromWork(tool: string, callId: string): Promise<void> {
  await until(
    `${callId} to leave the work stream`,
    async () => (await lastWorkOf(tool)) !== callId,
  );
}

describe("deadlines", () => {
  it("ends a call nobody serves with deadline_exceeded at its deadline, and clears its queued work", async () => {
    // The tool stays registered after its only executor stopped.
    await executor();
    await Promise.all(executors.splice(0).map((e) => e.stop()));
    const session = client.session("rel-nobody");
    const { message, ms } = await timed(
      session.submit({ id: "n1", name: "sleepy", arguments: { ms: 1 } }, { timeoutMs: 800 }).result,
    );
    session.close();
    expect(message.error).toMatchObject({ code: "deadline_exceeded" });
    expect(ms).toBeGreaterThanOrEqual(700);
    expect(ms).toBeLessThan(800 + 1_000);
    // The keeper deletes the work after it ended the call: the answer may come first.
    const jsm = await jetstreamManager(nc);
    await until("the call's queued work to be cleared", async () => {
      const work = await jsm.streams.info(createSubjects().streams.work, { subjects_filter: ">" });
      return work.state.messages === 0;
    });
  });

  it("ends a call whose executor hangs (SIGSTOP) at its deadline, and never answers it twice", async () => {
    const e = await executor();
    const session = client.session("rel-hung");
    const finals: ToolMessage[] = [];
    session.onEvent((ev) => ev.type === "result" && finals.push(ev.message));
    const handle = session.submit(
      { id: "h1", name: "sleepy", arguments: { ms: 3_000 } },
      { timeoutMs: 1_500 },
    );
    await startedOn(session, "h1");
    e.child.kill("SIGSTOP");
    const { message, ms } = await timed(handle.result);
    e.child.kill("SIGCONT");
    expect(message.error).toMatchObject({ code: "deadline_exceeded" });
    expect(ms).toBeLessThan(1_500 + 1_000);
    // The resumed executor sees the call ended and drops its own outcome.
    await e.waitForLog(
      (l) => l.callId === "h1" && /already ended|attempt failed|call failed/.test(String(l.msg)),
    );
    session.close();
    expect(finals).toHaveLength(1);
  });

  it("lets a call lower the tool's per-attempt timeout", async () => {
    await executor();
    const session = client.session("rel-attempt");
    const message = await session.submit(
      { id: "a1", name: "sleepy", arguments: { ms: 5_000 } },
      { attemptTimeoutMs: 300 },
    ).result;
    session.close();
    expect(message.error).toMatchObject({ code: "timeout", details: { timeout_ms: 300 } });
    expect(message.attempts).toBe(3);
  });
});

describe("the log line of a call's outcome", () => {
  it("carries small arguments whole and large ones by their size only", async () => {
    const e = await executor();
    const session = client.session("rel-logged-args");
    const small = { ms: 0, tag: "small" };
    const large = { ms: 0, tag: "x".repeat(64 * 1024) };
    for (const [id, args] of [
      ["s1", small],
      ["l1", large],
    ] as const)
      expect(
        (await session.submit({ id, name: "sleepy", arguments: args }).result).error,
      ).toBeUndefined();
    session.close();
    const line = (callId: string) =>
      e.waitForLog((l) => l.callId === callId && l.msg === "call succeeded");
    expect(await line("s1")).toMatchObject({ args: small });
    const logged = await line("l1");
    expect(logged.args).toBeUndefined();
    expect(logged.work_bytes).toBeGreaterThan(64 * 1024);
  });
});

describe("crashes", () => {
  it("redelivers the call of an executor killed mid-call to another executor", async () => {
    await Promise.all([executor(), executor()]);
    const session = client.session("rel-crash");
    const handle = session.submit(
      { id: "k1", name: "sleepy", arguments: { ms: 1_500 } },
      { timeoutMs: 20_000 },
    );
    const pid = await startedOn(session, "k1");
    const victim = executors.find((e) => e.pid === pid);
    await victim?.kill();
    const message = await handle.result;
    session.close();
    expect(message.error).toBeUndefined();
    expect((JSON.parse(message.content) as { pid: number }).pid).not.toBe(pid);
    expect(executions("default/rel-crash/rel-crash/k1")).toBe(2);
  });
});

describe("idempotency", () => {
  it("answers a resubmitted finished call from its stored result without running it again", async () => {
    await executor();
    const first = client.session("rel-dup");
    const original = await first.submit({ id: "d1", name: "sleepy", arguments: { ms: 10 } }).result;
    first.close();
    const again = client.session("rel-dup");
    const repeated = await again.submit({ id: "d1", name: "sleepy", arguments: { ms: 10 } }).result;
    again.close();
    expect(repeated).toEqual(original);
    expect(executions("default/rel-dup/rel-dup/d1")).toBe(1);
  });

  it("refuses the same idempotency key with other arguments", async () => {
    await executor();
    const session = client.session("rel-conflict");
    await session.submit({ id: "c1", name: "sleepy", arguments: { ms: 10 } }).result;
    const clash = await session.submit(
      { id: "c2", name: "sleepy", arguments: { ms: 20 } },
      { idempotencyKey: "rel-conflict/c1" },
    ).result;
    session.close();
    expect(clash.error).toMatchObject({
      code: "idempotency_conflict",
      details: { idempotency_key: "rel-conflict/c1" },
    });
    expect(executions("default/rel-conflict/rel-conflict/c1")).toBe(1);
  });
});

describe("cancellation", () => {
  it("aborts a running call and answers cancelled", async () => {
    const e = await executor();
    const session = client.session("rel-cancel-running");
    const handle = session.submit({ id: "x1", name: "sleepy", arguments: { ms: 10_000 } });
    await startedOn(session, "x1");
    const reply = await handle.cancel();
    const message = await handle.result;
    session.close();
    expect(reply).toEqual({
      cancelled: true,
      state: "cancelled",
      idempotency_key: "rel-cancel-running/x1",
    });
    expect(message.error).toMatchObject({ code: "cancelled" });
    await e.waitForLog(
      (l) =>
        l.callId === "x1" &&
        l.msg === "call had already ended (cancelled or past its deadline); result dropped",
    );
    expect(executions("default/rel-cancel-running/rel-cancel-running/x1")).toBe(1);
  });

  it("never starts a cancelled call that was still queued", async () => {
    await executor({ TOOLMESH_CONCURRENCY: "1" });
    const session = client.session("rel-cancel-queued");
    const busy = session.submit({ id: "q0", name: "sleepy", arguments: { ms: 600 } });
    await startedOn(session, "q0");
    const queued = session.submit({ id: "q1", name: "sleepy", arguments: { ms: 10 } });
    // Cancelled once it waits in the work stream (accepted); the only slot stays busy meanwhile.
    await queuedInWork("sleepy", "q1");
    const reply = await queued.cancel();
    expect(reply).toMatchObject({ cancelled: true, state: "cancelled" });
    expect((await queued.result).error).toMatchObject({ code: "cancelled" });
    expect((await busy.result).error).toBeUndefined();
    await takenFromWork("sleepy", "q1");
    session.close();
    expect(executions("default/rel-cancel-queued/rel-cancel-queued/q1")).toBe(0);
  });

  it("never starts a cancelled queued call whose work is young enough to skip the record read", async () => {
    await executor({ TOOLMESH_CONCURRENCY: "1" });
    const session = client.session("rel-cancel-fresh");
    // A first call drains the tool's work consumer; a long one then keeps the only slot busy
    // until the executor has listened to aborts for longer than the window (ADR 0027).
    await session.submit({ id: "f0", name: "sleepy", arguments: { ms: 1 } }).result;
    const busyMs = 2 * Defaults.freshWorkWindowMs;
    const busy = session.submit({ id: "f1", name: "sleepy", arguments: { ms: busyMs } });
    await startedOn(session, "f1");
    // A time window, not readiness: the queued call must still be young when it is taken.
    await delay(busyMs - Defaults.freshWorkWindowMs / 2);
    const queued = session.submit({ id: "f2", name: "sleepy", arguments: { ms: 10 } });
    await queuedInWork("sleepy", "f2");
    expect(await queued.cancel()).toMatchObject({ cancelled: true, state: "cancelled" });
    expect((await queued.result).error).toMatchObject({ code: "cancelled" });
    expect((await busy.result).error).toBeUndefined();
    await takenFromWork("sleepy", "f2");
    session.close();
    expect(executions("default/rel-cancel-fresh/rel-cancel-fresh/f2")).toBe(0);
  });

  it("keeps a cancellation that comes before its call: the call is answered cancelled and never runs", async () => {
    await executor();
    const session = client.session("rel-cancel-early");
    // The cancellation overtakes the call (here: it is sent first).
    const reply = await session.cancel("e1");
    const message = await session.submit({ id: "e1", name: "sleepy", arguments: { ms: 10 } })
      .result;
    session.close();
    // No call had the key yet: nothing was ended, the cancellation waits for the call.
    expect(reply).toEqual({
      cancelled: false,
      state: "pending",
      idempotency_key: "rel-cancel-early/e1",
    });
    expect(message.error).toMatchObject({ code: "cancelled" });
    expect(message.name).toBe("sleepy");
    expect(executions("default/rel-cancel-early/rel-cancel-early/e1")).toBe(0);
  });

  it("says so when the call had already ended", async () => {
    await executor();
    const session = client.session("rel-cancel-late");
    const handle = session.submit({ id: "l1", name: "sleepy", arguments: { ms: 1 } });
    await handle.result;
    const reply = await handle.cancel();
    session.close();
    expect(reply).toEqual({
      cancelled: false,
      state: "done",
      idempotency_key: "rel-cancel-late/l1",
    });
  });
});

describe("graceful shutdown", () => {
  it("reports not-ready first, finishes calls in flight within the grace time and exits 0", async () => {
    const port = 20_000 + Math.floor(Math.random() * 20_000);
    const e = await executor({
      TOOLMESH_HEALTH_PORT: String(port),
      TOOLMESH_SHUTDOWN_GRACE_MS: "5000",
    });
    expect((await fetch(`http://127.0.0.1:${port}/readyz`)).status).toBe(200);
    const session = client.session("rel-drain");
    const handle = session.submit({ id: "g1", name: "sleepy", arguments: { ms: 800 } });
    await startedOn(session, "g1");
    const exited = e.stop();
    // Not ready from the signal on, while the call in flight finishes.
    await expect
      .poll(async () => (await fetch(`http://127.0.0.1:${port}/readyz`)).status)
      .toBe(503);
    const message = await handle.result;
    session.close();
    expect(message.error).toBeUndefined();
    expect(await exited).toBe(0);
  });

  it("hands calls still running after the grace time back to another executor", async () => {
    const leaving = await executor({ TOOLMESH_SHUTDOWN_GRACE_MS: "200" });
    const session = client.session("rel-handback");
    const handle = session.submit(
      // Long enough to outlast starting the second executor on a busy machine.
      { id: "b1", name: "sleepy", arguments: { ms: 10_000 } },
      { timeoutMs: 40_000 },
    );
    await startedOn(session, "b1");
    const staying = await executor();
    expect(await leaving.stop()).toBe(0);
    const message = await handle.result;
    session.close();
    expect(message.error).toBeUndefined();
    expect((JSON.parse(message.content) as { pid: number }).pid).toBe(staying.pid);
  });

  it("does not stay past the grace and force times for a handler deaf to its abort signal", async () => {
    const leaving = await executor({
      TOOLMESH_SHUTDOWN_GRACE_MS: "300",
      TOOLMESH_SHUTDOWN_FORCE_MS: "700",
    });
    const session = client.session("rel-deaf");
    session.submit(
      { id: "d1", name: "stubborn", arguments: { ms: 30_000 } },
      { timeoutMs: 60_000 },
    );
    await startedOn(session, "d1");
    const began = Date.now();
    const code = await leaving.stop();
    const took = Date.now() - began;
    session.close();
    // The attempt is handed back at the grace time; the handler's own 30 s timer holds nothing.
    expect(code).toBe(0);
    expect(took).toBeLessThan(10_000);
    expect(leaving.lines.some((l) => l.abandoned !== undefined)).toBe(false);
  });
});

describe("backpressure", () => {
  it("answers overloaded, with a retry-after, past a session's in-flight limit and only for that session", async () => {
    await executor();
    const busy = client.session("rel-busy");
    const messages = await busy.submitAll(
      Array.from({ length: 4 }, (_, i) => ({
        id: `p${i}`,
        name: "sleepy",
        arguments: { ms: 400 },
      })),
    ).results;
    const other = client.session("rel-calm");
    const calm = await other.submit({ id: "o1", name: "sleepy", arguments: { ms: 1 } }).result;
    busy.close();
    other.close();
    const codes = messages.map((m) => m.error?.code ?? "ok").sort();
    expect(codes).toEqual(["ok", "ok", "overloaded", "overloaded"]);
    const overloaded = messages.find((m) => m.error?.code === "overloaded");
    expect(overloaded?.error).toMatchObject({
      retryable: true,
      details: { retry_after_ms: 1_000 },
    });
    expect(calm.error).toBeUndefined();
  });
});

describe("server version gate", () => {
  it("refuses to start against a server without JetStream, saying what to do", async () => {
    const plain = await startNatsServer({ jetstream: false });
    try {
      const failed = startService("resolver", { NATS_URL: plain.url }, 10_000);
      await expect(failed).rejects.toThrow(/JetStream disabled: start it with -js/);
    } finally {
      await plain.stop();
    }
  });
});
