import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Msg, NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { MeshCallPlane } from "@toolmesh/call-store";
import { openCallPlane } from "@toolmesh/call-store";
import type { ControlDeps } from "@toolmesh/control-plane/internal";
import { listDeadLetters } from "@toolmesh/control-plane";
import { deadLetter } from "@toolmesh/control-plane/internal";
import type { CallRequest, ToolMessage } from "@toolmesh/protocol";
import { createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The dead-letter keeper's handling of a calls-stream message against a real server, with no
// resolver running: the message stays in the stream until it is dead-lettered.
let server: NatsServerHandle;
let nc: NatsConnection;
let plane: MeshCallPlane;
let deps: ControlDeps;
const subjects = createSubjects({ prefix: "dead" });
const address = { tenant: "default", session: "s" };

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  plane = await openCallPlane(nc, { subjects });
  deps = { nc, plane, subjects, log: createLogger({ service: "test", level: "silent" }) };
}, 30_000);

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

/** Puts a call request in the calls stream, as a frontend does; returns its sequence. */
async function submit(callId: string, idempotencyKey?: string): Promise<number> {
  const request: CallRequest = {
    tool_call: { id: callId, type: "function", function: { name: "echo", arguments: "{}" } },
    session_id: "s",
    ...(idempotencyKey === undefined ? {} : { idempotency_key: idempotencyKey }),
  };
  const ack = await plane.js.publish(subjects.call(address), encodeJson(request));
  return ack.seq;
}

/** Records the call as accepted by a resolver. */
async function accept(callId: string, idempotencyKey = `s/${callId}`): Promise<void> {
  await plane.store.accept({
    idempotency_key: idempotencyKey,
    call_id: callId,
    session_id: "s",
    address,
    tool: "echo",
    args_hash: "h",
    state: "accepted",
    deadline_at: plane.clock.now() + 60_000,
  });
}

function target(callId: string, idempotencyKey = `s/${callId}`) {
  return { address, call_id: callId, idempotency_key: idempotencyKey };
}

function answer(callId: string, content: string): ToolMessage {
  return { role: "tool", tool_call_id: callId, name: "echo", session_id: "s", content };
}

/** Every final message published for a call from now on, as it comes. */
function finalsOf(callId: string): ToolMessage[] {
  const seen: ToolMessage[] = [];
  nc.subscribe(subjects.result(address, callId), {
    callback: (err: Error | null, msg: Msg) => {
      if (err === null) seen.push(decodeJson(msg.data) as ToolMessage);
    },
  });
  return seen;
}

/** Final messages the sessions stream holds for a call. */
async function storedFinals(callId: string): Promise<number> {
  const info = await plane.jsm.streams.info(subjects.streams.sessions, {
    subjects_filter: subjects.result(address, callId),
  });
  return info.state.subjects?.[subjects.result(address, callId)] ?? 0;
}

describe("dead-lettering a calls-stream message", () => {
  it("leaves a call that ended already with its one final message", async () => {
    const seq = await submit("c1");
    await accept("c1");
    expect(await plane.finalize(target("c1"), answer("c1", "done"))).toBe(true);
    const finals = finalsOf("c1");
    await nc.flush();

    await deadLetter(deps, subjects.streams.calls, seq, "max_deliveries", 20);

    await nc.flush();
    expect(finals).toEqual([]);
    expect(await storedFinals("c1")).toBe(1);
    expect((await plane.store.get(target("c1")))?.record.result?.content).toBe("done");
    // The letter is there all the same, and the message left its stream.
    const letters = await listDeadLetters(nc, subjects);
    expect(letters.find((l) => l.original_seq === seq)).toMatchObject({ call_id: "c1" });
    expect(await plane.jsm.streams.getMessage(subjects.streams.calls, { seq })).toBeNull();
  });

  it("ends an accepted call by compare-and-set, so a later outcome is not published", async () => {
    const seq = await submit("c2");
    await accept("c2");
    const finals = finalsOf("c2");
    await nc.flush();

    await deadLetter(deps, subjects.streams.calls, seq, "max_deliveries", 20);
    // An executor finishing the call afterwards loses.
    expect(await plane.finalize(target("c2"), answer("c2", "late"))).toBe(false);

    await nc.flush();
    expect(finals).toHaveLength(1);
    expect(finals[0]?.error).toMatchObject({
      code: "tool_error",
      details: { dead_letter: true, deliveries: 20 },
    });
    expect(await storedFinals("c2")).toBe(1);
    expect((await plane.store.get(target("c2")))?.record.state).toBe("done");
  });

  it("answers a call never accepted, and one whose key another call holds, without touching that call", async () => {
    const fresh = await submit("c3");
    const finalsFresh = finalsOf("c3");
    await accept("c4", "shared");
    const other = await submit("c5", "shared");
    const finalsOther = finalsOf("c5");
    await nc.flush();

    await deadLetter(deps, subjects.streams.calls, fresh, "max_deliveries", 20);
    await deadLetter(deps, subjects.streams.calls, other, "max_deliveries", 20);

    await nc.flush();
    expect(finalsFresh.map((m) => m.error?.code)).toEqual(["tool_error"]);
    expect(finalsOther.map((m) => m.error?.code)).toEqual(["tool_error"]);
    // The call holding the key goes on.
    expect((await plane.store.get(target("c4", "shared")))?.record.state).toBe("accepted");
    expect(await plane.finalize(target("c4", "shared"), answer("c4", "ok"))).toBe(true);
  });
});
