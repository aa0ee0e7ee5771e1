// The resolver's handlers driven directly against a real server, with no running resolver:
// `handleCall` takes a call from the calls stream as a service would, and `routeCall` is
// called with a resolution of our own. What they publish is read back from the streams.
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { headers } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import type { JetStreamClient, JsMsg } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { MeshCallPlane } from "@toolmesh/call-store";
import {
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  openCallPlane,
} from "@toolmesh/call-store";
import { ensureConsumer, ensureStream, meshPlan, tenantAuditStreamSpec } from "@toolmesh/nats";
import type { AuditRecord } from "@toolmesh/audit";
import { AuditTrail, readTrail, verifyTrail } from "@toolmesh/audit";
import type { CallRequest, ResolvedCall, ToolMessage } from "@toolmesh/protocol";
import {
  ErrorCode,
  Header,
  callKey,
  createSubjects,
  decodeJson,
  encodeJson,
} from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import {
  Admission,
  SessionLimits,
  handleCall,
  resolveRequest,
  routeCall,
  routedUnderRecord,
} from "@toolmesh/resolver/internal";
import type { ResolverDeps } from "@toolmesh/resolver/internal";
import { createLogger, toolmeshMetrics, trace } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { present } from "./helpers/present.js";

const subjects = createSubjects({ prefix: "hc" });
const address = { tenant: "default", session: "s1" };
const log = createLogger({ service: "test", level: "silent" });

let server: NatsServerHandle;
let nc: NatsConnection;
let js: JetStreamClient;
let plane: MeshCallPlane;
let registry: ToolRegistry;

function deps(overrides: Partial<ResolverDeps> = {}): ResolverDeps {
  return {
    subjects,
    registry,
    log,
    tracer: trace.getTracer("test"),
    plane,
    control: {
      deadLetter: () => Promise.reject(new Error("no call here is dead-lettered")),
    },
    admission: new Admission({ limits: new SessionLimits(256), metrics: toolmeshMetrics() }),
    metrics: toolmeshMetrics(),
    defaultTimeoutMs: 60_000,
    callRetentionMs: 86_400_000,
    ...overrides,
  };
}

function request(id: string, name: string, args: Record<string, unknown>): CallRequest {
  return {
    session_id: address.session,
    tool_call: { id, type: "function", function: { name, arguments: JSON.stringify(args) } },
  };
}

/** Submits a call as a frontend does and takes it from the resolver's consumer. */
async function submitted(body: unknown): Promise<JsMsg> {
  await js.publish(subjects.call(address), encodeJson(body));
  const consumer = await js.consumers.get(subjects.streams.calls, subjects.resolverConsumer);
  const msg = await consumer.next({ expires: 5_000 });
  if (msg === null) throw new Error("the submitted call was not delivered");
  return msg;
}

/** The last final message stored for a call id on the session, if any. */
async function resultFor(callId: string): Promise<ToolMessage | undefined> {
  const stored = await plane.jsm.streams
    .getMessage(subjects.streams.sessions, { last_by_subj: subjects.result(address, callId) })
    .catch(() => null);
  return stored === null ? undefined : (decodeJson(stored.data) as ToolMessage);
}

/** A resolver's trail in `required` mode, with the tenant's audit stream in place. */
async function requiredTrail(): Promise<AuditTrail> {
  await ensureStream(plane.jsm, tenantAuditStreamSpec(subjects, address.tenant));
  return AuditTrail.open(nc, { subjects, mode: "required", chains: true, writer: "test" });
}

/** Whether the calls stream is empty and nothing is pending: every call taken was acked. */
async function callsSettled(): Promise<{ messages: number; pending: number }> {
  await nc.flush();
  const info = await plane.jsm.consumers.info(subjects.streams.calls, subjects.resolverConsumer);
  const stream = await plane.jsm.streams.info(subjects.streams.calls);
  return { messages: stream.state.messages, pending: info.num_ack_pending };
}

async function workMessages(): Promise<number> {
  return (await plane.jsm.streams.info(subjects.streams.work)).state.messages;
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  js = jetstream(nc);
  plane = await openCallPlane(nc, { subjects });
  await ensureConsumer(plane.jsm, meshPlan(subjects, {}).consumers.resolver);
  registry = await ToolRegistry.open(nc, { subjects, log });
  await registry.register({
    name: "echo",
    description: "Echoes its text.",
    summary: "Echoes its text.",
    parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
    kind: "builtin",
    owner: "test",
  });
  await vi.waitFor(() => expect(registry.get("echo")).toBeDefined());
});

beforeEach(async () => {
  await plane.jsm.streams.purge(subjects.streams.work);
});

afterAll(async () => {
  registry?.close();
  await nc?.close();
  await server?.stop();
});

describe("handleCall", () => {
  it("answers an invalid call on its session and acks it", async () => {
    const msg = await submitted(request("bad-1", "ecko", { text: "hi" }));
    await handleCall(deps(), msg);

    const answer = await resultFor("bad-1");
    expect(answer?.error?.code).toBe(ErrorCode.UnknownTool);
    expect(answer?.content).toContain('did you mean "echo"');
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
    expect(await workMessages()).toBe(0);
  });

  it("records each step of a delivery handled twice once in the tenant's audit trail", async () => {
    const audit = await requiredTrail();
    const consumer = await js.consumers.get(subjects.streams.calls, subjects.resolverConsumer);
    /** Handles a delivery as a resolver that dies before acknowledging it, then again. */
    const twice = async (body: CallRequest): Promise<void> => {
      const first = await submitted(body);
      const unacked = Object.assign(Object.create(first) as JsMsg, { ack: () => first.nak() });
      await handleCall(deps({ audit }), unacked);
      const again = await consumer.next({ expires: 5_000 });
      expect(again?.seq).toBe(first.seq);
      await handleCall(deps({ audit }), present(again, "the call delivered again"));
    };
    await twice(request("audit-1", "echo", { text: "hi" }));
    await twice(request("audit-2", "ecko", { text: "hi" }));
    await expect.poll(() => audit.pending).toBe(0);
    const events: AuditRecord[] = [];
    for await (const { record } of readTrail(nc, subjects, address.tenant))
      events.push(record as AuditRecord);
    expect(events.map((e) => `${e.call_id} ${e.type}`)).toEqual([
      "audit-1 call.admitted",
      "audit-2 call.refused",
    ]);
    expect(await verifyTrail(nc, subjects, address.tenant)).toEqual({ ok: true, count: 2 });
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
    audit.stop();
  });

  it("routes a call another delivery took up while the first could not record its admission, and refuses nothing", async () => {
    const audit = await requiredTrail();
    // The first delivery's admission cannot be written, which it learns only after its ack
    // wait: the call came to a second delivery meanwhile.
    let release = (): void => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const unwritten = new Proxy(audit, {
      get(target, prop) {
        if (prop === "tryRecord") return () => gate.then(() => false);
        const value: unknown = Reflect.get(target, prop, target);
        return typeof value === "function" ? (value as () => unknown).bind(target) : value;
      },
    });
    const msg = await submitted(request("taken-up", "echo", { text: "hi" }));
    const delivery = () =>
      Object.assign(Object.create(msg) as JsMsg, { ack: () => undefined, nak: () => undefined });
    const key = callKey(address, `${address.session}/taken-up`);
    const first = handleCall(deps({ audit: unwritten }), delivery());
    await vi.waitFor(async () => expect(await plane.store.byKey(key)).toBeDefined());
    await handleCall(deps({ audit }), delivery());
    expect(await workMessages()).toBe(1);
    release();
    await first;
    // The first delivery cannot take the record back: the call goes on, and nothing refuses it.
    expect((await plane.store.byKey(key))?.record.state).toBe("accepted");
    expect(await resultFor("taken-up")).toBeUndefined();
    msg.ack();
    await expect.poll(() => audit.pending).toBe(0);
    audit.stop();
  });

  it("answers a body that is not JSON, keyed by its stream sequence", async () => {
    await js.publish(subjects.call(address), new TextEncoder().encode("{not json"));
    const consumer = await js.consumers.get(subjects.streams.calls, subjects.resolverConsumer);
    const msg = await consumer.next({ expires: 5_000 });
    if (msg === null) throw new Error("not delivered");
    await handleCall(deps(), msg);

    const answer = await resultFor(`invalid-${msg.seq}`);
    expect(answer?.error?.code).toBe(ErrorCode.InvalidRequest);
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
  });

  it("routes a valid call: record accepted, work published with its deadline and record revision", async () => {
    const msg = await submitted(request("ok-1", "echo", { text: "hi" }));
    await handleCall(deps(), msg);

    const record = await plane.store.get({ idempotency_key: `${address.session}/ok-1`, address });
    expect(record?.record.state).toBe("accepted");
    expect(await workMessages()).toBe(1);
    const work = present(
      await plane.jsm.streams.getMessage(subjects.streams.work, {
        last_by_subj: subjects.work("echo"),
      }),
      "the work message",
    );
    const routed = decodeJson(work.data) as ResolvedCall;
    expect(routed).toMatchObject({ call_id: "ok-1", tool: "echo", arguments: { text: "hi" } });
    // What the deadline keeper and the executor read without touching the call record.
    expect(work.header.get(Header.Deadline)).toBe(String(routed.deadline_at));
    expect(work.header.get(Header.CallKey)).toBe(callKey(address, `${address.session}/ok-1`));
    expect(work.header.get(Header.RecordRevision)).toBe(String(record?.revision));
    expect(await resultFor("ok-1")).toBeUndefined();
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
  });

  it("answers a known key from its stored result, under the new call id, and runs nothing", async () => {
    const key = "known-1";
    await plane.store.accept({
      idempotency_key: key,
      call_id: "first-call",
      session_id: address.session,
      address,
      tool: "echo",
      args_hash: argumentsHash(JSON.stringify({ text: "hi" })),
      state: "accepted",
      deadline_at: Date.now() + 60_000,
    });
    await plane.finalize(
      { idempotency_key: key, call_id: "first-call", address },
      {
        role: "tool",
        tool_call_id: "first-call",
        name: "echo",
        session_id: address.session,
        content: "stored answer",
      },
    );

    const msg = await submitted({
      ...request("second-call", "echo", { text: "hi" }),
      idempotency_key: key,
    });
    await handleCall(deps(), msg);

    const answer = await resultFor("second-call");
    expect(answer).toMatchObject({ tool_call_id: "second-call", content: "stored answer" });
    expect(answer?.error).toBeUndefined();
    expect(await workMessages()).toBe(0);
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
  });
});

describe("routeCall", () => {
  it("answers overloaded when the session is over its in-flight limit, counts it, and routes nothing", async () => {
    const metrics = toolmeshMetrics();
    const refusedCount = vi.spyOn(metrics, "tenantRefused");
    const limited = deps({
      admission: new Admission({ limits: new SessionLimits(1), metrics }),
      metrics,
    });
    const first = await submitted(request("busy-1", "echo", { text: "a" }));
    await handleCall(limited, first);
    expect(await workMessages()).toBe(1);

    const second = await submitted(request("busy-2", "echo", { text: "b" }));
    const resolution = resolveRequest(registry, decodeJson(second.data), address, {
      now: Date.now(),
      defaultTimeoutMs: 60_000,
    });
    if (!resolution.ok) throw resolution.error;
    await routeCall(limited, resolution, second, log);
    second.ack();

    const answer = await resultFor("busy-2");
    expect(answer?.error?.code).toBe(ErrorCode.Overloaded);
    expect(answer?.error?.details).toMatchObject({ max_in_flight: 1 });
    // In the tenants' refusals, by reason: the tenant has no quota, so it is not labelled.
    expect(refusedCount.mock.calls).toEqual([
      [undefined, ErrorCode.Overloaded, "session_max_in_flight"],
    ]);
    expect(
      await plane.store.get({ idempotency_key: `${address.session}/busy-1`, address }),
    ).toBeDefined();
    expect(
      await plane.store.get({ idempotency_key: `${address.session}/busy-2`, address }),
    ).toBeUndefined();
    expect(await workMessages()).toBe(1);
  });

  it("answers a resubmission whose record vanished from its stored result, or refuses it, and never runs it again", async () => {
    const kv = await new Kvm(nc).open(subjects.callsBucket);
    const ran = async (id: string): Promise<number> => {
      const msg = await submitted(request(id, "echo", { text: id }));
      await handleCall(deps(), msg);
      const work = await plane.jsm.streams.getMessage(subjects.streams.work, {
        last_by_subj: subjects.work("echo"),
      });
      return present(work, "the work message").seq;
    };
    const key = (id: string) => callKey(address, `${address.session}/${id}`);

    // Ran and answered; the executor took the work; then the record vanished.
    const first = await ran("gone-1");
    await plane.finalize(
      { idempotency_key: `${address.session}/gone-1`, call_id: "gone-1", address },
      { role: "tool", tool_call_id: "gone-1", name: "echo", session_id: "s1", content: "once" },
    );
    await plane.jsm.streams.deleteMessage(subjects.streams.work, first);
    await kv.purge(key("gone-1"));
    await handleCall(deps(), await submitted(request("gone-1", "echo", { text: "gone-1" })));
    expect(await workMessages()).toBe(0);
    expect(await resultFor("gone-1")).toMatchObject({ content: "once" });
    expect((await plane.store.get({ idempotency_key: "s1/gone-1", address }))?.record.state).toBe(
      "done",
    );

    // Routed, then both its record and its answer vanished: refused, not left waiting.
    const second = await ran("gone-2");
    await plane.jsm.streams.deleteMessage(subjects.streams.work, second);
    await kv.purge(key("gone-2"));
    await handleCall(deps(), await submitted(request("gone-2", "echo", { text: "gone-2" })));
    expect(await workMessages()).toBe(0);
    const refusal = await resultFor("gone-2");
    expect(refusal?.error?.code).toBe(ErrorCode.Unavailable);
    expect(refusal?.error?.message).toContain("was routed before and its record is gone");
    expect(await callsSettled()).toEqual({ messages: 0, pending: 0 });
  });

  it("tells work another delivery routed under this call's record from work routed under an earlier record", async () => {
    const kv = await new Kvm(nc).open(subjects.callsBucket);
    /** A call's record and its routing, as a resolver makes them. */
    const raced = (id: string) => {
      const args = { text: id };
      const resolution = resolveRequest(registry, request(id, "echo", args), address, {
        now: Date.now(),
        defaultTimeoutMs: 60_000,
      });
      if (!resolution.ok) throw resolution.error;
      const call = resolution.resolved;
      const key = callKey(address, call.idempotency_key);
      const record = callRecordOf(call, argumentsHash(JSON.stringify(args)));
      const accept = async (): Promise<number> => {
        const outcome = await plane.store.accept(record);
        if (outcome.status !== "new") throw new Error(`the record was ${outcome.status}`);
        return outcome.revision;
      };
      const route = (revision: number) => {
        const hdrs = headers();
        const known = knownRecordHeaders(record, { status: "new", revision }) ?? {};
        for (const [k, v] of Object.entries(known)) hdrs.set(k, v);
        return js.publish(subjects.work("echo"), encodeJson(call), { msgID: key, headers: hdrs });
      };
      return { call, key, accept, route };
    };

    const { call, accept, route } = raced("race-1");
    // This resolver created the record and held the call; another delivery of it routed it.
    const revision = await accept();
    expect((await route(revision)).duplicate).toBe(false);
    const repeat = await route(revision);
    expect(repeat.duplicate).toBe(true);
    expect(await routedUnderRecord(plane.jsm, plane.store, call, repeat, revision)).toBe(true);
    // A work stream that cannot answer now (here: no responder at that API) is not a gone
    // message: the check throws, and the call is handed back to be looked at again.
    const unanswered = await jetstreamManager(nc, {
      apiPrefix: "hc.nowhere",
      timeout: 1_000,
      checkAPI: false,
    });
    await expect(
      routedUnderRecord(unanswered, plane.store, call, repeat, revision),
    ).rejects.toThrow();
    // Taken and ended by an executor: the record changed since.
    await plane.jsm.streams.deleteMessage(subjects.streams.work, repeat.seq);
    expect(await routedUnderRecord(plane.jsm, plane.store, call, repeat, revision)).toBe(false);
    await plane.store.finish(call, {
      role: "tool",
      tool_call_id: "race-1",
      name: "echo",
      session_id: "s1",
      content: "ran",
    });
    expect(await routedUnderRecord(plane.jsm, plane.store, call, repeat, revision)).toBe(true);

    // Routed under an earlier record, which is gone: the work waits, or an executor took it.
    const gone = raced("race-2");
    const earlier = await gone.accept();
    const first = await gone.route(earlier);
    expect(first.duplicate).toBe(false);
    await kv.purge(gone.key);
    const later = await gone.accept();
    const again = await gone.route(later);
    expect(again.duplicate).toBe(true);
    expect(await routedUnderRecord(plane.jsm, plane.store, gone.call, again, later)).toBe(false);
    await plane.jsm.streams.deleteMessage(subjects.streams.work, first.seq);
    expect(await routedUnderRecord(plane.jsm, plane.store, gone.call, again, later)).toBe(false);
  });
});
