import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { Msg, NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { MeshCallPlane } from "@toolmesh/call-store";
import { openCallPlane } from "@toolmesh/call-store";
import type { DeadlineKeeper } from "@toolmesh/control-plane/internal";
import { deadlineHeaders } from "@toolmesh/control-plane";
import { startDeadlineKeeper } from "@toolmesh/control-plane/internal";
import { ensureDurableConsumer, publishDurable, tracedHeaders } from "@toolmesh/nats";
import type { ResolvedCall, ToolMessage } from "@toolmesh/protocol";
import { Header, callKey, createSubjects, decodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { connectionCounters, startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { resolvedCall, routeAsResolver } from "./helpers/calls.js";

// The deadline keeper against a real server: it follows the work stream (core subscription
// and replay) and the results, with no message of its own for a call that ends in time.
let server: NatsServerHandle;
let nc: NatsConnection;
let plane: MeshCallPlane;
const subjects = createSubjects({ prefix: "keeper" });
const log = createLogger({ service: "test", level: "silent" });
const address = { tenant: "default", session: "s" };
const open: NatsConnection[] = [];
const keepers: DeadlineKeeper[] = [];
let n = 0;

function call(timeoutMs: number, tool = "idle"): ResolvedCall {
  return resolvedCall({ id: `c${++n}`, tool, address, now: plane.clock.now(), timeoutMs });
}

/** Records and routes a call as the resolver does; returns the work message's sequence. */
function route(c: ResolvedCall): Promise<number> {
  return routeAsResolver(plane, subjects, c);
}

async function keeper(name: string): Promise<{ keeper: DeadlineKeeper; conn: NatsConnection }> {
  const conn = await connect({ servers: server.url, name });
  open.push(conn);
  const keeperPlane = await openCallPlane(conn, { subjects });
  const k = await startDeadlineKeeper({ nc: conn, plane: keeperPlane, subjects, log });
  keepers.push(k);
  await k.replay();
  return { keeper: k, conn };
}

/** A tool's answer to `c`. */
function doneMessage(c: ResolvedCall): ToolMessage {
  return {
    role: "tool",
    tool_call_id: c.call_id,
    name: c.tool,
    content: "ok",
    session_id: c.session_id,
  };
}

/** Every message published on a subject from now on, as it comes. */
function collect(subject: string): Msg[] {
  const seen: Msg[] = [];
  nc.subscribe(subject, {
    callback: (err, msg) => {
      if (err === null) seen.push(msg);
    },
  });
  return seen;
}

async function workHolds(seq: number): Promise<boolean> {
  return (await plane.jsm.streams.getMessage(subjects.streams.work, { seq })) !== null;
}

/** Client → server messages of one named connection. */
async function inMsgs(name: string): Promise<number> {
  return (await connectionCounters(server, name)).in_msgs ?? 0;
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  plane = await openCallPlane(nc, { subjects });
}, 30_000);

afterEach(() => {
  for (const k of keepers.splice(0)) k.stop();
});

afterAll(async () => {
  for (const conn of open) await conn.close().catch(() => undefined);
  await nc?.close();
  await server?.stop();
});

describe("the deadline keeper", () => {
  it("ends work nobody takes at its deadline and removes the work", async () => {
    await keeper("keeper-a");
    const results = collect(subjects.allResults);
    const aborts = collect(subjects.abort);
    const c = call(1_500);
    const seq = await route(c);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    const final = decodeJson(results[0]!.data) as ToolMessage;
    expect(final.error?.code).toBe("deadline_exceeded");
    expect(final.tool_call_id).toBe(c.call_id);
    // Ended at the deadline on the server's clock, not much later.
    expect(plane.clock.now()).toBeGreaterThanOrEqual(c.deadline_at);
    expect(plane.clock.now() - c.deadline_at).toBeLessThan(3_000);
    await expect.poll(() => workHolds(seq), { timeout: 5_000 }).toBe(false);
    expect(aborts).toHaveLength(1);
    expect((await plane.store.get(c))?.record.state).toBe("done");
  });

  it("reads a deadline header it cannot use from the body, and passes over work that holds no call", async () => {
    const { keeper: k } = await keeper("keeper-bad-headers");
    const results = collect(subjects.allResults);
    // Foreign bytes on a work subject: nothing to watch, nothing thrown.
    await plane.js.publish(subjects.work("idle"), new TextEncoder().encode("not a call"));
    const c = call(1_500);
    await route(c);
    // The same call's work again under another id, with headers that say nothing usable.
    await publishDurable(plane.js, subjects.work(c.tool), c, {
      msgId: `${callKey(c.address, c.idempotency_key)}:again`,
      headers: tracedHeaders({ [Header.Deadline]: "soon", [Header.CallKey]: "" }),
    });
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    expect((decodeJson(results[0]!.data) as ToolMessage).error?.code).toBe("deadline_exceeded");
    // The copy and the foreign bytes stay in the stream: the next tests start from an empty one.
    await plane.jsm.streams.purge(subjects.streams.work);
  });

  it("ends work queued before it started, found by reading the stream", async () => {
    const results = collect(subjects.allResults);
    const c = call(2_000);
    const seq = await route(c);
    const { keeper: k } = await keeper("keeper-late");
    expect(k.watched).toBe(1);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    expect((decodeJson(results[0]!.data) as ToolMessage).error?.code).toBe("deadline_exceeded");
    await expect.poll(() => workHolds(seq), { timeout: 5_000 }).toBe(false);
  });

  it("ends a call whose work was queued again under another sequence", async () => {
    const results = collect(subjects.allResults);
    const c = call(2_000);
    const first = await route(c);
    // Read from the stream, so the keeper knows the work's sequence; then the work is queued
    // once more, as the dead-letter keeper does with work whose deliveries ran out (ADR 0030).
    const { keeper: k } = await keeper("keeper-requeued");
    expect(k.watched).toBe(1);
    const again = await publishDurable(plane.js, subjects.work(c.tool), c, {
      msgId: `requeue:${subjects.streams.work}:${first}`,
      headers: deadlineHeaders(c),
    });
    await plane.jsm.streams.deleteMessage(subjects.streams.work, first);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    expect((decodeJson(results[0]!.data) as ToolMessage).error?.code).toBe("deadline_exceeded");
    await expect.poll(() => workHolds(again.seq), { timeout: 5_000 }).toBe(false);
  });

  it("costs nothing for a call that ends in time: no message from the keeper, and it forgets the call", async () => {
    const { keeper: k } = await keeper("keeper-quiet");
    const before = await inMsgs("keeper-quiet");
    const c = call(1_000);
    const seq = await route(c);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    // An executor ends the call and acknowledges its work (here: removes it).
    const done = doneMessage(c);
    expect(await plane.finalize(c, done)).toBe(true);
    await plane.jsm.streams.deleteMessage(subjects.streams.work, seq);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(0);
    // Past the deadline: still nothing sent by the keeper's connection. An absence has no event
    // to wait for, so this waits out the deadline itself.
    await new Promise((resolve) => setTimeout(resolve, c.deadline_at - plane.clock.now() + 500));
    expect((await plane.store.get(c))?.record.result?.content).toBe("ok");
    expect(await inMsgs("keeper-quiet")).toBe(before);
  });

  it("ends at its deadline a call whose work was lost before the call ended", async () => {
    const { keeper: k } = await keeper("keeper-lost-work");
    const results = collect(subjects.allResults);
    const aborts = collect(subjects.abort);
    const c = call(1_500);
    const seq = await route(c);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    // The work disappears while the call's record is still open (a server lost the write).
    await plane.jsm.streams.deleteMessage(subjects.streams.work, seq);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    const final = decodeJson(results[0]!.data) as ToolMessage;
    expect(final.error?.code).toBe("deadline_exceeded");
    expect(final.tool_call_id).toBe(c.call_id);
    expect(plane.clock.now()).toBeGreaterThanOrEqual(c.deadline_at);
    expect((await plane.store.get(c))?.record.state).toBe("done");
    expect(aborts).toHaveLength(1);
    expect(k.watched).toBe(0);
  });

  it("forgets, when it reads the stream again, calls whose work left while it looked away", async () => {
    const { keeper: k } = await keeper("keeper-reread");
    const c = call(60_000);
    const seq = await route(c);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    // The call ended and its work went while this keeper missed the final message (as across a
    // reconnect): the work's absence and the record tell.
    await plane.store.finish(c, doneMessage(c));
    await plane.jsm.streams.deleteMessage(subjects.streams.work, seq);
    expect(k.watched).toBe(1);
    await k.replay();
    expect(k.watched).toBe(0);
  });

  it("keeps watching, when it reads the stream again, a call whose work was lost, and ends it at its deadline", async () => {
    const { keeper: k } = await keeper("keeper-reread-lost");
    const results = collect(subjects.allResults);
    const c = call(2_500);
    const seq = await route(c);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    // The work goes while the record stays open (a server lost it), then the keeper reads the
    // stream again (as after a reconnect).
    await plane.jsm.streams.deleteMessage(subjects.streams.work, seq);
    await k.replay();
    expect(k.watched).toBe(1);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    const final = decodeJson(results[0]!.data) as ToolMessage;
    expect(final.error?.code).toBe("deadline_exceeded");
    expect(final.error?.message).toBe(`call ${c.call_id} did not finish by its deadline`);
    expect((await plane.store.get(c))?.record.state).toBe("done");
  });

  it("two keepers end a call once", async () => {
    await keeper("keeper-1");
    await keeper("keeper-2");
    const results = collect(subjects.allResults);
    const aborts = collect(subjects.abort);
    const c = call(1_500);
    const seq = await route(c);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBeGreaterThanOrEqual(1);
    await expect.poll(() => workHolds(seq), { timeout: 5_000 }).toBe(false);
    // The other keeper's answer, if it made one, is an absence to wait for, not an event.
    await new Promise((resolve) => setTimeout(resolve, 500));
    // Live subscribers may see a copy when both act at once; the stream keeps one message.
    expect(new Set(results.map((m) => Buffer.from(m.data).toString()))).toHaveProperty("size", 1);
    expect(aborts).toHaveLength(1);
    const info = await plane.jsm.streams.info(subjects.streams.sessions, {
      subjects_filter: subjects.result(address, c.call_id),
    });
    expect(info.state.subjects?.[subjects.result(address, c.call_id)]).toBe(1);
  });

  it("ends a call waiting in retry backoff at its deadline", async () => {
    await keeper("keeper-backoff");
    const tool = "flaky";
    await ensureDurableConsumer(plane.jsm, {
      stream: subjects.streams.work,
      name: subjects.workConsumer(tool),
      filterSubject: subjects.work(tool),
      ackWaitMs: 10_000,
      maxDeliver: 5,
      maxAckPending: 100,
    });
    const results = collect(subjects.allResults);
    const c = call(1_500, tool);
    const seq = await route(c);
    // An executor's attempt failed: the work is handed back for a retry after the deadline.
    const worker = await plane.js.consumers.get(subjects.streams.work, subjects.workConsumer(tool));
    const attempt = await worker.next({ expires: 5_000 });
    expect(attempt?.seq).toBe(seq);
    attempt?.nak(30_000);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    expect((decodeJson(results[0]!.data) as ToolMessage).error?.code).toBe("deadline_exceeded");
    await expect.poll(() => workHolds(seq), { timeout: 5_000 }).toBe(false);
  });
});
