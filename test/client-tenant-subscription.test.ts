import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { Session, SessionEvent } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startLedgerMesh } from "./helpers/mesh.js";

// A client that follows its sessions through one subscription to the tenant's session events
// (`tenantSubscription`, what the MCP gateway uses): every answer still reaches the session it
// is for and no other, and the server keeps one subscription however many sessions open.

const NAME = "tenant-subscription";
const subjects = createSubjects();
let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let ledgerDir: string;

beforeAll(async () => {
  server = await startNatsServer();
  ({ ledgerDir } = await startLedgerMesh(server.url, "sleepy"));
  nc = await connect({
    servers: server.url,
    name: NAME,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
  });
  client = new ToolmeshClient(nc, {
    tenant: "t.1",
    tenantSubscription: true,
    deadlineGraceMs: 10_000,
  });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
  rmSync(ledgerDir, { recursive: true, force: true });
});

/** The subjects this test's connection is subscribed to, as the server lists them. */
async function serverSubscriptions(): Promise<string[]> {
  const res = await fetch(`${server.monitorUrl}/connz?subs=1`);
  const connz = (await res.json()) as {
    connections: { name?: string; subscriptions_list?: string[] }[];
  };
  return connz.connections.find((c) => c.name === NAME)?.subscriptions_list ?? [];
}

/** Every event a session sees, collected as they come. */
function collect(session: Session): SessionEvent[] {
  const seen: SessionEvent[] = [];
  session.onEvent((e) => seen.push(e));
  return seen;
}

describe("one subscription for every session of the tenant", () => {
  it("delivers each session its own results and progress, and the server holds one subscription", async () => {
    const sessions = Array.from({ length: 12 }, (_, i) => client.session(`s-${i}`));
    const events = sessions.map(collect);
    const handles = sessions.map((s, i) =>
      s.submit({ id: `c-${i}`, name: "sleepy", arguments: { ms: 300, tag: `s-${i}` } }),
    );
    await nc.flush();
    const subscribed = await serverSubscriptions();
    const sessionSubjects = subscribed.filter((s) =>
      s.startsWith(`${subjects.prefix}.v1.sessions.`),
    );
    expect(sessionSubjects).toEqual([subjects.tenantEvents("t.1")]);

    const messages = await Promise.all(handles.map((h) => h.result));
    expect(messages.map((m) => m.error?.code ?? "ok")).toEqual(Array(12).fill("ok"));
    messages.forEach((m, i) =>
      expect(m).toMatchObject({ tool_call_id: `c-${i}`, session_id: `s-${i}` }),
    );
    events.forEach((seen, i) => {
      expect(seen.length).toBeGreaterThanOrEqual(2);
      for (const e of seen) {
        if (e.type === "progress") expect(e.event).toMatchObject({ tool_call_id: `c-${i}` });
        else if (e.type === "result") expect(e.message.session_id).toBe(`s-${i}`);
        else throw new Error(`unexpected ${e.type} event`);
      }
      expect(seen.some((e) => e.type === "progress")).toBe(true);
    });
    for (const s of sessions) s.close();
    expect(
      (await serverSubscriptions()).filter((s) => s.startsWith(`${subjects.prefix}.v1.sessions.`)),
    ).toEqual([subjects.tenantEvents("t.1")]);
  });

  it("gives both sessions of one id the answer, and goes on for one after the other closes", async () => {
    const a = client.session("twin");
    const b = client.session("twin");
    const seenByB = collect(b);
    const first = await a.submit({ id: "t-1", name: "sleepy", arguments: { ms: 5 } }).result;
    expect(first.error).toBeUndefined();
    await expect.poll(() => seenByB.some((e) => e.type === "result")).toBe(true);
    a.close();
    const second = await b.submit({ id: "t-2", name: "sleepy", arguments: { ms: 5 } }).result;
    expect(second).toMatchObject({ tool_call_id: "t-2", session_id: "twin" });
    b.close();
  });

  it("settles a conflicting resubmission with its rejection, and a cancelled call with cancelled", async () => {
    const session = client.session("s-reject");
    expect(
      (await session.submit({ id: "r-1", name: "sleepy", arguments: { ms: 5 } }).result).error,
    ).toBeUndefined();
    const conflict = await session.submit({ id: "r-1", name: "sleepy", arguments: { ms: 6 } })
      .result;
    expect(conflict.error?.code).toBe("idempotency_conflict");

    const started = new Promise<void>((resolve) =>
      session.onEvent((e) => {
        if (e.type === "progress" && e.event.tool_call_id === "r-2") resolve();
      }),
    );
    const long = session.submit({ id: "r-2", name: "sleepy", arguments: { ms: 20_000 } });
    await started;
    expect((await long.cancel()).cancelled).toBe(true);
    expect((await long.result).error?.code).toBe("cancelled");
    session.close();
  });

  it("answers a call whose result came while the connection was away, after a server restart", async () => {
    const session = client.session("s-restart");
    const started = new Promise<void>((resolve) =>
      session.onEvent((e) => {
        if (e.type === "progress" && e.event.tool_call_id === "k-1") resolve();
      }),
    );
    const running = session.submit(
      { id: "k-1", name: "sleepy", arguments: { ms: 1_500 } },
      { timeoutMs: 30_000 },
    );
    await started;
    await server.kill();
    await server.restart();
    const message = await running.result;
    expect(message).toMatchObject({ tool_call_id: "k-1", session_id: "s-restart" });
    expect(message.error).toBeUndefined();
    session.close();
  });
});
