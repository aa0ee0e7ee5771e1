import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { headers as natsHeaders } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { MeshCallPlane, CallRecord } from "@toolmesh/call-store";
import {
  ANY_ARGUMENTS,
  argumentsHash,
  callRecordOf,
  knownRecordHeaders,
  knownRecordOf,
  openCallPlane,
} from "@toolmesh/call-store";
import type { ResolvedCall, ToolMessage } from "@toolmesh/protocol";
import { Header, createSubjects, decodeJson, encodeJson } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The compare-and-set behind "exactly one final message", against a real server: accept, finish
// and the call plane's finalize, including the races and the winner that died before publishing.
let server: NatsServerHandle;
let nc: NatsConnection;
let plane: MeshCallPlane;
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

/** A final message as the store keeps it: stamped with the arguments of the call it ends. */
function final(key: string, content: string): ToolMessage {
  return { ...message(key, content), args_hash: argumentsHash('{"text":"hi"}') };
}

function target(key: string) {
  return { idempotency_key: key, call_id: `call-${key}`, address };
}

/** Every final message on the session's result subject of `key`, as a live subscriber sees it. */
function watch(key: string): { received: ToolMessage[]; flushed: () => Promise<void> } {
  const received: ToolMessage[] = [];
  nc.subscribe(subjects.result(address, `call-${key}`), {
    callback: (_err, msg) => {
      received.push(decodeJson(msg.data) as ToolMessage);
    },
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
    const created = await store.accept(record("a1"));
    expect(created.status).toBe("new");
    // The revision it reports is the stored record's, the one a compare-and-set needs.
    const stored = await store.get(target("a1"));
    expect(created.status === "new" && created.revision).toBe(stored?.revision);
    const again = await store.accept(record("a1"));
    expect(again).toEqual({
      status: "in_flight",
      record: stored?.record,
      revision: stored?.revision,
    });
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

describe("CallStore.withdraw", () => {
  it("takes back a new record, so the key is accepted afresh; a record changed since stays", async () => {
    const { store } = plane;
    const first = await store.accept(record("w1"));
    if (first.status !== "new") throw new Error(`accepted as ${first.status}`);
    await store.withdraw(target("w1"), first.revision);
    expect(await store.get(target("w1"))).toBeUndefined();
    const again = await store.accept(record("w1"));
    expect(again.status).toBe("new");
    if (again.status !== "new") return;
    // Finished meanwhile: not the record accepted, so it is not taken back.
    await store.finish(target("w1"), message("w1", "done"));
    await expect(store.withdraw(target("w1"), again.revision)).rejects.toThrow();
    expect((await store.get(target("w1")))?.record.state).toBe("done");
  });
});

describe("a work message's record headers", () => {
  const call = {
    idempotency_key: "h1",
    call_id: "call-h1",
    session_id: "s",
    address,
    tool: "echo",
    deadline_at: Date.now() + 60_000,
  } as unknown as ResolvedCall;
  const hash = argumentsHash('{"text":"hi"}');

  it("let an executor rebuild the stored record and finish it by its revision", async () => {
    const { store } = plane;
    const built = callRecordOf(call, hash);
    const accepted = await store.accept(built);
    const headers = knownRecordHeaders(built, accepted);
    expect(headers).toBeDefined();
    const h = natsHeaders();
    for (const [k, v] of Object.entries(headers ?? {})) h.set(k, v);
    const known = knownRecordOf(call, h);
    expect(known).toEqual(await store.get(target("h1")));
    expect(await store.finish(target("h1"), message("h1", "ok"), known)).toEqual({
      won: true,
      result: final("h1", "ok"),
      encoded: Buffer.from(encodeJson(final("h1", "ok"))),
    });
  });

  it("are left out when the stored record is another submission's", async () => {
    const { store } = plane;
    await store.accept(record("h2", { call_id: "first-submission" }));
    const built = callRecordOf({ ...call, idempotency_key: "h2", call_id: "call-h2" }, hash);
    const accepted = await store.accept(built);
    expect(accepted.status).toBe("in_flight");
    expect(knownRecordHeaders(built, accepted)).toBeUndefined();
  });

  it("are ignored when absent or malformed", () => {
    expect(knownRecordOf(call, undefined)).toBeUndefined();
    for (const [revision, argsHash] of [
      ["", hash],
      ["7", ""],
      ["0", hash],
      ["-3", hash],
      ["1e3", hash],
      ["12345678901234567890", hash],
      ["7", ANY_ARGUMENTS],
      ["7", "not-a-hash"],
    ] as const) {
      const h = natsHeaders();
      if (revision !== "") h.set(Header.RecordRevision, revision);
      if (argsHash !== "") h.set(Header.ArgsHash, argsHash);
      expect(knownRecordOf(call, h), `${revision} ${argsHash}`).toBeUndefined();
    }
  });
});

describe("CallStore.finish", () => {
  it("moves a call to done once; later parties get the stored message", async () => {
    const { store } = plane;
    const accepted = record("f1");
    await store.accept(accepted);
    // The winner gets its message as the bytes to publish; the record is stored with it.
    expect(await store.finish(target("f1"), message("f1", "first"))).toEqual({
      won: true,
      result: final("f1", "first"),
      encoded: Buffer.from(encodeJson(final("f1", "first"))),
    });
    const second = await store.finish(target("f1"), message("f1", "second"));
    expect(second).toEqual({ won: false, result: final("f1", "first") });
    const stored = await store.get(target("f1"));
    expect(stored?.record).toEqual({ ...accepted, state: "done", result: final("f1", "first") });
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
    expect(outcome).toEqual({ won: false, result: final("f3", "deadline") });
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
