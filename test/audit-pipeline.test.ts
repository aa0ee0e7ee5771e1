import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import { ensureStream, tenantAuditStreamSpec } from "@toolmesh/nats";
import type { AuditRecord } from "@toolmesh/audit";
import {
  AuditEventType,
  AuditTrail,
  EndRecorder,
  readTrail,
  serveAuditWrites,
  verifyTrail,
} from "@toolmesh/audit";
import { pino } from "pino";
import { callRecordOf, openCallPlane } from "@toolmesh/call-store";
import { resolvedCall } from "./helpers/calls.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The trail's pipelined writer against a real server: several processes' writers (one
// connection each) append batches to one tenant's chain at once, racing for its tail. The chain
// must come out whole: every event once, each writer's events in the order it recorded them.

const subjects = createSubjects();
const TENANT = "acme";
const WRITERS = 4;
const EVENTS = 400;
const REPEATING = "initech";
const LETTERS = "hooli";
const ENDED = "pied";
const HANDED = "umbrella";
const TAIL_REPEAT = "soylent";
const BOUNDED = "wayne";
const UNWRITABLE = "tyrell";
const WRITABLE = "cyberdyne";
let server: NatsServerHandle;
const connections: NatsConnection[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  connections.push(nc);
  const jsm = await jetstreamManager(nc);
  await ensureStream(jsm, tenantAuditStreamSpec(subjects, TENANT));
  await ensureStream(jsm, tenantAuditStreamSpec(subjects, REPEATING));
  await ensureStream(jsm, tenantAuditStreamSpec(subjects, LETTERS));
  await ensureStream(jsm, tenantAuditStreamSpec(subjects, ENDED));
  await ensureStream(jsm, tenantAuditStreamSpec(subjects, HANDED));
}, 30_000);

afterAll(async () => {
  await Promise.all(connections.map((nc) => nc.close()));
  await server?.stop();
});

/** The admission of call `i`, under a step's own id (`{prefix}-{i}`), as a resolver records it. */
function admission(prefix: string, i: number) {
  return {
    id: `${prefix}-${i}`,
    type: AuditEventType.Admitted,
    call_id: `${prefix}${i}`,
    at: Date.now(),
    data: { i },
  };
}

describe("writers racing for one tenant's chain", () => {
  it("keep one verifying chain, every event once and in each writer's order", async () => {
    const trails = await Promise.all(
      Array.from({ length: WRITERS }, async (_, w) => {
        const nc = await connect({ servers: server.url });
        connections.push(nc);
        return AuditTrail.open(nc, {
          subjects,
          mode: "required",
          chains: true,
          writer: `w${w}`,
          batchMax: 32,
        });
      }),
    );
    const writes: Promise<unknown>[] = [];
    // Recorded in bursts, so batches of many sizes meet other writers' batches.
    for (let i = 0; i < EVENTS; i++) {
      for (const [w, trail] of trails.entries()) {
        const event = { type: AuditEventType.Ended, call_id: `w${w}-${i}`, at: Date.now() };
        writes.push(
          i % 7 === 0
            ? trail.tryRecord(TENANT, { ...event, data: { i } })
            : trail.record(TENANT, { ...event, data: { i } }),
        );
      }
      if (i % 50 === 0) await Promise.all(writes);
    }
    const settled = await Promise.all(writes);
    expect(settled.filter((s) => s === false)).toEqual([]);
    for (const trail of trails) expect(trail.pending).toBe(0);

    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(connections[0] as NatsConnection, subjects, TENANT))
      events.push(record as AuditRecord);
    expect(events).toHaveLength(WRITERS * EVENTS);
    expect(new Set(events.map((e) => e.id)).size).toBe(events.length);
    for (let w = 0; w < WRITERS; w++) {
      const order = events.filter((e) => e.by === `w${w}`).map((e) => e.data.i);
      expect(order).toEqual(Array.from({ length: EVENTS }, (_, i) => i));
    }
    const verified = await verifyTrail(connections[0] as NatsConnection, subjects, TENANT);
    expect(verified).toEqual({ ok: true, count: WRITERS * EVENTS });
  }, 120_000);

  it("keeps a step recorded again under its id once, in the middle of a batch too", async () => {
    const nc = connections[0] as NatsConnection;
    const trail = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: true,
      writer: "again",
    });
    const step = (i: number) => admission("step", i);
    await trail.record(REPEATING, step(1));
    // The same step again (a delivery handled twice), among new ones, in one batch.
    const written = await Promise.all(
      [step(1), step(2), step(1), step(3)].map((e) => trail.tryRecord(REPEATING, e)),
    );
    expect(written).toEqual([true, true, true, true]);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, REPEATING))
      events.push(record as AuditRecord);
    expect(events.map((e) => e.id)).toEqual(["step-1", "step-2", "step-3"]);
    expect(await verifyTrail(nc, subjects, REPEATING)).toEqual({ ok: true, count: 3 });
    trail.stop();
  });

  it("keeps a repeat of the chain's last event once, and chains the event behind it", async () => {
    const nc = connections[0] as NatsConnection;
    const jsm = await jetstreamManager(nc);
    await ensureStream(jsm, tenantAuditStreamSpec(subjects, TAIL_REPEAT));
    const open = (writer: string) =>
      AuditTrail.open(nc, { subjects, mode: "required", chains: true, writer });
    const step = (i: number) => admission("tail", i);
    const first = await open("first");
    expect(await first.tryRecord(TAIL_REPEAT, step(1))).toBe(true);
    // Another process records the same step (it never saw it written), twice, then a new one:
    // the first goes alone, the second and the new one in one batch on the tail the first is.
    const second = await open("second");
    const written = await Promise.all(
      [step(1), step(1), step(2)].map((e) => second.tryRecord(TAIL_REPEAT, e)),
    );
    expect(written).toEqual([true, true, true]);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, TAIL_REPEAT))
      events.push(record as AuditRecord);
    expect(events.map((e) => e.id)).toEqual(["tail-1", "tail-2"]);
    expect(await verifyTrail(nc, subjects, TAIL_REPEAT)).toEqual({ ok: true, count: 2 });
    first.stop();
    second.stop();
  });

  it("settles: waits for what is recorded, and says how much could not be written by then; a step is told of a first write", async () => {
    const nc = connections[0] as NatsConnection;
    const trail = await AuditTrail.open(nc, {
      subjects,
      mode: "best-effort",
      chains: true,
      writer: "settling",
    });
    const event = { type: AuditEventType.Ended, at: Date.now(), data: {} };
    void trail.record(REPEATING, event);
    // A tenant with no audit stream: its event cannot be written. A step that waits for its
    // first write is told so at once; the event is kept and retried.
    expect(await trail.recordAndWait("no-such-tenant", event)).toBe(false);
    expect(await trail.recordAndWait(REPEATING, event)).toBe(true);
    expect(trail.pending).toBe(1);
    expect(await trail.settle(1_000)).toBe(1);
    // Stopped: what is recorded now stays unwritten.
    void trail.record(REPEATING, event);
    expect(await trail.settle(1_000)).toBe(2);
  });
});

describe("events handed to the resolvers", () => {
  it("are chained under their own writer's name, kept while no resolver answers, and a bad batch is refused", async () => {
    // An executor's connection: answers come to its own inbox.
    const nc = await connect({
      servers: server.url,
      inboxPrefix: subjects.inboxPrefix("executor"),
    });
    connections.push(nc);
    let failedWrites = 0;
    const executor = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: false,
      writer: "executor@x/1",
      retryMinMs: 50,
      retryMaxMs: 100,
      observer: {
        auditWritten: () => undefined,
        auditWriteFailed: () => void failedWrites++,
        auditDropped: () => undefined,
      },
    });
    const event = (i: number) => ({
      type: AuditEventType.AttemptStarted,
      call_id: `h${i}`,
      at: Date.now(),
      data: { i },
    });
    // No resolver yet: the events are kept and retried, and a step waiting for its record waits
    // for a resolver to take it (one that went on would take the record with it if killed).
    let first: boolean | undefined;
    const waiting = executor.recordAndWait(HANDED, event(0)).then((w) => (first = w));
    void executor.record(HANDED, event(1));
    // Three hand-ons nobody answered, and the step still waits.
    await expect.poll(() => failedWrites, { timeout: 5_000 }).toBeGreaterThanOrEqual(3);
    expect(first).toBeUndefined();
    expect(executor.pending).toBe(2);

    const resolver = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: true,
      writer: "resolver@x/2",
    });
    const served = serveAuditWrites(nc, subjects, resolver, pino({ level: "silent" }));
    await resolver.record(HANDED, { ...event(2), type: AuditEventType.Admitted });
    expect(await waiting).toBe(true);
    // Written after the ones kept, which the same run carries.
    expect(await executor.recordAndWait(HANDED, event(3))).toBe(true);
    expect(executor.pending).toBe(0);
    // A tenant whose trail refuses the events (it has no audit stream): the resolver answers so,
    // and the step is told at once; the event stays queued.
    expect(await executor.recordAndWait("no-such-tenant", event(5))).toBe(false);
    expect(executor.pending).toBe(1);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, HANDED))
      events.push(record as AuditRecord);
    // Each under the process that did the step, the handed ones in the order recorded.
    expect(events.filter((e) => e.by === "executor@x/1").map((e) => e.data.i)).toEqual([0, 1, 3]);
    expect(events.filter((e) => e.by === "resolver@x/2").map((e) => e.data.i)).toEqual([2]);
    expect(events).toHaveLength(4);

    // A batch of another shape, an unknown event type, a body that is not JSON: refused with
    // a typed error that says what was wrong; nothing written, the service goes on.
    for (const body of [
      JSON.stringify({ events: [{ ...event(9), id: "x" }] }),
      JSON.stringify({ events: [{ ...event(9), id: "x", by: "y", type: "call.forged" }] }),
      "{not json",
    ]) {
      const reply = (await nc.request(subjects.auditWrite(HANDED), body)).json<{
        ok: boolean;
        error: { code: string; message: string };
      }>();
      expect(reply.ok).toBe(false);
      expect(reply.error.code).toBe("invalid_request");
      expect(reply.error.message).toMatch(/audit write request/);
    }
    // A request whose answer would go anywhere but a hand-on service's inbox (here a subject
    // someone listens on; a KV key or a stream's subject alike) is neither written nor answered.
    const elsewhere = "toolmesh.v1.elsewhere";
    const heard: string[] = [];
    nc.subscribe(elsewhere, {
      callback: (_err, msg) => {
        heard.push(msg.string());
      },
    });
    const misdirected = { events: [{ ...event(8), id: "misdirected", by: "executor@x/1" }] };
    nc.publish(subjects.auditWrite(HANDED), JSON.stringify(misdirected), { reply: elsewhere });
    await nc.flush();
    expect(await executor.recordAndWait(HANDED, event(4))).toBe(true);
    expect(heard).toEqual([]);
    expect(await verifyTrail(nc, subjects, HANDED)).toEqual({ ok: true, count: 5 });
    await served.stop();
    resolver.stop();
    executor.stop();
  });
});

describe("the call plane", () => {
  it("records a dead-lettered call in its tenant's trail, and a letter that holds no call nowhere", async () => {
    const nc = connections[0] as NatsConnection;
    const trail = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: true,
      writer: "plane",
    });
    const plane = await openCallPlane(nc, { subjects, audit: trail });
    const call = resolvedCall({
      id: "dl-1",
      tool: "echo",
      address: { tenant: LETTERS, session: "s" },
    });
    const letter = {
      tool: "echo",
      reason: "max_deliveries",
      stream: subjects.streams.work,
      subject: subjects.work("echo"),
      deliveries: 5,
    };
    await plane.deadLetter({ ...letter, seq: 7, data: encodeJson(call) });
    await plane.deadLetter({ ...letter, seq: 8, data: new TextEncoder().encode("not a call") });
    await expect.poll(() => trail.pending).toBe(0);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, LETTERS))
      events.push(record as AuditRecord);
    expect(events).toEqual([
      expect.objectContaining({
        type: "call.dead_lettered",
        call_id: "dl-1",
        session: "s",
        tool: "echo",
        data: { reason: "max_deliveries", deliveries: 5, stream: subjects.streams.work },
      }),
    ]);
    trail.stop();
  });

  it("keeps at most its bound of a failing tenant's events, drops the rest (said once), and writes those kept once it can", async () => {
    const nc = connections[0] as NatsConnection;
    let dropped = 0;
    const told: number[] = [];
    const trail = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: true,
      writer: "resolver@x/3",
      queueMax: 5,
      retryMinMs: 50,
      retryMaxMs: 100,
      observer: {
        auditWritten: () => undefined,
        auditWriteFailed: () => undefined,
        auditDropped: () => void dropped++,
      },
      onDropping: (_tenant, queued) => void told.push(queued),
    });
    const event = (i: number) => ({ type: AuditEventType.Refused, at: Date.now(), data: { i } });
    // The tenant has no audit stream yet: its first write fails, and it is kept.
    expect(await trail.recordAndWait(BOUNDED, event(0))).toBe(false);
    const recorded = Array.from({ length: 9 }, (_, i) => trail.record(BOUNDED, event(i + 1)));
    // Four more are kept; the five past the bound are dropped (their steps go on), said once.
    await Promise.all(recorded.slice(4));
    expect(trail.pending).toBe(5);
    expect(dropped).toBe(5);
    expect(told).toEqual([5]);
    // A step that must be written first is told at once that it was not.
    expect(await trail.tryRecord(BOUNDED, event(99))).toBe(false);
    await ensureStream(await jetstreamManager(nc), tenantAuditStreamSpec(subjects, BOUNDED));
    await Promise.all(recorded.slice(0, 4));
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, BOUNDED))
      events.push(record as AuditRecord);
    expect(events.map((e) => e.data.i)).toEqual([0, 1, 2, 3, 4]);
    trail.stop();
  });

  it("hands back a failing tenant's ends up to its bound and drops the rest, while the other tenants' are recorded", async () => {
    const nc = connections[0] as NatsConnection;
    const jsm = await jetstreamManager(nc);
    // The tenant's audit stream takes nothing: every write of its trail fails.
    const spec = tenantAuditStreamSpec(subjects, UNWRITABLE, { tenantStoreBytes: 100 });
    await ensureStream(jsm, spec);
    await ensureStream(jsm, tenantAuditStreamSpec(subjects, WRITABLE));
    const trail = await AuditTrail.open(nc, {
      subjects,
      mode: "required",
      chains: true,
      writer: "resolver@x/4",
      retryMinMs: 50,
      retryMaxMs: 100,
    });
    let dropped = 0;
    const errors: string[] = [];
    const log = {
      warn: () => undefined,
      error: (_f: object, msg: string) => void errors.push(msg),
    };
    const ends = await EndRecorder.start(nc, subjects, trail, log, {
      heldMax: 2,
      observer: { auditDropped: () => void dropped++ },
    });
    const js = jetstream(nc);
    const final = (tenant: string, id: string) =>
      js.publish(
        subjects.result({ tenant, session: "s" }, id),
        encodeJson({
          role: "tool",
          tool_call_id: id,
          name: "echo",
          content: "ok",
          session_id: "s",
        }),
        { msgID: `result:${tenant}:${id}` },
      );
    for (let i = 0; i < 4; i++) await final(UNWRITABLE, `u${i}`);
    await final(WRITABLE, "after-unwritable");
    const endsOf = async (tenant: string) => {
      const events: AuditRecord[] = [];
      for await (const { record } of readTrail(nc, subjects, tenant))
        events.push(record as AuditRecord);
      return events.map((e) => e.call_id);
    };
    await expect.poll(() => endsOf(WRITABLE), { timeout: 10_000 }).toContain("after-unwritable");
    await expect.poll(() => dropped, { timeout: 10_000 }).toBe(2);
    expect(errors.filter((e) => e.includes("further ends are dropped"))).toHaveLength(1);
    // Once the tenant's trail can be written, the two held are recorded.
    await jsm.streams.update(spec.name, { max_bytes: -1 });
    await expect.poll(() => endsOf(UNWRITABLE), { timeout: 15_000 }).toHaveLength(2);
    const info = await jsm.consumers.info(subjects.streams.sessions, subjects.auditEndsConsumer);
    expect(info.num_ack_pending + info.num_pending).toBe(0);
    await ends.stop(1_000);
    trail.stop();
  });

  it("records each call's end from its stored final message once: named by its publisher, or found unrecorded", async () => {
    const nc = connections[0] as NatsConnection;
    const open = (writer: string) =>
      AuditTrail.open(nc, { subjects, mode: "required", chains: true, writer });
    const trail = await open("resolver@x/1");
    const ends = await EndRecorder.start(nc, subjects, trail, pino({ level: "silent" }));
    // An executor recording the ends it publishes, and one that was killed right after
    // publishing before it could record anything.
    const executor = await openCallPlane(nc, { subjects, audit: await open("executor@x/2") });
    const unrecorded = await openCallPlane(nc, { subjects });
    const [named, found] = ["end-1", "end-2"].map((id) =>
      resolvedCall({ id, tool: "echo", address: { tenant: ENDED, session: "s" } }),
    );
    if (named === undefined || found === undefined) throw new Error("two calls");
    const done = (call: typeof named): ToolMessage => ({
      role: "tool",
      tool_call_id: call.call_id,
      name: call.tool,
      content: "ok",
      session_id: call.session_id,
    });
    for (const call of [named, found]) await executor.store.accept(callRecordOf(call, "h"));
    expect(await executor.finalize(named, done(named))).toBe(true);
    expect(await unrecorded.finalize(found, done(found))).toBe(true);
    // Its work comes back to another executor, which finds the call ended; twice, here.
    expect(await executor.finalize(found, done(found))).toBe(false);
    expect(await executor.finalize(found, done(found))).toBe(false);
    const jsm = await jetstreamManager(nc);
    await expect
      .poll(async () => {
        const info = await jsm.consumers.info(
          subjects.streams.sessions,
          subjects.auditEndsConsumer,
        );
        return info.num_pending + info.num_ack_pending;
      })
      .toBe(0);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, ENDED))
      events.push(record as AuditRecord);
    expect(events.map((e) => `${e.call_id} ${e.type} ${String(e.data.outcome)} ${e.by}`)).toEqual([
      "end-1 call.ended ok executor@x/2",
      "end-2 call.ended ok resolver@x/1",
    ]);
    await ends.stop(1_000);
    trail.stop();
  });
});
