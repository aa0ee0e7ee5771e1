import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { CallPlane, CallRecord } from "@toolmesh/call-store";
import { ANY_ARGUMENTS, argumentsHash, openCallPlane } from "@toolmesh/call-store";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects, decodeJson } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The compare-and-set behind "exactly one final message", against a real server: accept, finish
// and the call plane's finalize, including the races and the winner that died before publishing.
let server: NatsServerHandle;
let nc: NatsConnection;
let plane: CallPlane;
const subjects = createSubjects({ prefix: "cs" });
const address = { tenant: "default", session: "s" };

function record(key: string, overrides: Partial<CallRecord> = {}): CallRecord {
  return {
    idempotency_key: key,
    call_id: `call-${key}`,
    session_id: "s",
    address,
    tool: "echo",
    args_hash: argumentsHash('{"text":"hi"}'),
    state: "accepted",
    deadline_at: Date.now() + 60_000,
    ...overrides,
  };
}

function message(key: string, content: string): ToolMessage {
  return { role: "tool", tool_call_id: `call-${key}`, name: "echo", session_id: "s", content };
}

function target(key: string) {
  return { idempotency_key: key, call_id: `call-${key}`, address };
}

/** Every final message on the session's result subject of `key`, as a live subscriber sees it. */
function watch(key: string): { received: ToolMessage[]; flushed: () => Promise<void> } {
  const received: ToolMessage[] = [];
  nc.subscribe(subjects.result(address, `call-${key}`), {
    callback: (_err, msg) => received.push(decodeJson(msg.data) as ToolMessage),
  });
  return { received, flushed: () => nc.flush() };
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  plane = await openCallPlane(nc, { subjects });
});

afterAll(async () => {
  await nc.close();
  await server.stop();
});

describe("CallStore.accept", () => {
  it("records a new key, then tells a repeat, a conflict and an ended call apart", async () => {
    const { store } = plane;
    expect(await store.accept(record("a1"))).toEqual({ status: "new" });
    expect((await store.accept(record("a1"))).status).toBe("in_flight");
    const conflict = await store.accept(record("a1", { args_hash: argumentsHash("{}") }));
    expect(conflict.status).toBe("conflict");
    expect((await store.accept(record("a1", { tool: "other" }))).status).toBe("conflict");
    await store.finish(target("a1"), message("a1", "done"));
    const done = await store.accept(record("a1"));
    expect(done.status).toBe("done");
    expect(done.status === "done" && done.record.result.content).toBe("done");
  });

  it("lets any call through a record made by an early cancellation", async () => {
    const { store } = plane;
    await store.accept(record("a2", { args_hash: ANY_ARGUMENTS }));
    await store.finish(target("a2"), message("a2", "cancelled"));
    const outcome = await store.accept(record("a2", { args_hash: argumentsHash('{"x":1}') }));
    expect(outcome.status).toBe("done");
  });
});

describe("CallStore.finish", () => {
  it("moves a call to done once; later parties get the stored message", async () => {
    const { store } = plane;
    await store.accept(record("f1"));
    expect(await store.finish(target("f1"), message("f1", "first"))).toEqual({
      won: true,
      result: message("f1", "first"),
    });
    const second = await store.finish(target("f1"), message("f1", "second"));
    expect(second).toEqual({ won: false, result: message("f1", "first") });
    expect((await store.get(target("f1")))?.record.result?.content).toBe("first");
  });

  it("has exactly one winner when many parties finish at once", async () => {
    const { store } = plane;
    await store.accept(record("f2"));
    const known = await store.get(target("f2"));
    const outcomes = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        store.finish(target("f2"), message("f2", `party ${i}`), known),
      ),
    );
    const winners = outcomes.filter((o) => o?.won === true);
    expect(winners).toHaveLength(1);
    for (const o of outcomes) expect(o?.result).toEqual(winners[0]?.result);
  });

  it("finds a stale known record out and reads the current one", async () => {
    const { store } = plane;
    await store.accept(record("f3"));
    const stale = await store.get(target("f3"));
    await store.finish(target("f3"), message("f3", "deadline"));
    const outcome = await store.finish(target("f3"), message("f3", "late result"), stale);
    expect(outcome).toEqual({ won: false, result: message("f3", "deadline") });
  });

  it("is undefined for a key without a record", async () => {
    expect(await plane.store.finish(target("never"), message("never", "x"))).toBeUndefined();
  });
});

describe("CallPlane.finalize", () => {
  it("publishes the winner's message once; a loser publishes nothing", async () => {
    await plane.store.accept(record("p1"));
    const wire = watch("p1");
    expect(await plane.finalize(target("p1"), message("p1", "result"))).toBe(true);
    expect(await plane.finalize(target("p1"), message("p1", "deadline"))).toBe(false);
    await wire.flushed();
    expect(wire.received.map((m) => m.content)).toEqual(["result"]);
  });

  it("publishes the stored message when the winner died between recording and publishing", async () => {
    await plane.store.accept(record("p2"));
    const wire = watch("p2");
    // The winner records its result and dies before publishing it.
    await plane.store.finish(target("p2"), message("p2", "recorded, never published"));
    expect(await plane.finalize(target("p2"), message("p2", "deadline"))).toBe(false);
    await wire.flushed();
    expect(wire.received.map((m) => m.content)).toEqual(["recorded, never published"]);
    // Now the sessions stream holds it: the next party publishes nothing.
    expect(await plane.finalize(target("p2"), message("p2", "cancelled"))).toBe(false);
    await wire.flushed();
    expect(wire.received).toHaveLength(1);
  });
});
