import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamManager } from "@nats-io/jetstream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { MeshCallPlane, CallRecord } from "@toolmesh/call-store";
import { openCallPlane } from "@toolmesh/call-store";
import { ensureDurableConsumer } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import type { CallRequest, ResolvedCall, ToolMessage } from "@toolmesh/protocol";
import { reconcileOrphans, startDeadlineKeeper } from "@toolmesh/control-plane/internal";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { leaveOrphans } from "./helpers/orphans.js";
import { resolvedCall } from "./helpers/calls.js";

// Orphans are built on the streams as the services create them (work queues, through
// `openCallPlane`) with durable consumers as the services configure them: the stream files are
// put back under a later consumer state, as a killed nats-server 2.9 leaves them.
let server: NatsServerHandle;
let nc: NatsConnection;
const subjects = createSubjects({ prefix: "orphans" });
const log = createLogger({ service: "test", level: "silent" });
const address = { tenant: "default", session: "s" };

function request(id: string): CallRequest {
  return {
    tool_call: { id, type: "function", function: { name: "t", arguments: "{}" } },
    session_id: "s",
  };
}

function work(id: string): ResolvedCall {
  return resolvedCall({ id, tool: "t", address });
}

function record(id: string, state: CallRecord["state"]): CallRecord {
  return {
    idempotency_key: `s/${id}`,
    call_id: id,
    session_id: "s",
    address,
    tool: "t",
    args_hash: "h",
    state,
    deadline_at: Date.now() + 60_000,
    ...(state === "done"
      ? { result: { role: "tool", tool_call_id: id, name: "t", content: "done", session_id: "s" } }
      : {}),
  };
}

/** Sequence → message id of what a stream holds. */
async function contents(jsm: JetStreamManager, stream: string): Promise<Map<number, string>> {
  const state = (await jsm.streams.info(stream)).state;
  const found = new Map<number, string>();
  for (let seq = state.first_seq; seq <= state.last_seq; seq++) {
    const m = await jsm.streams.getMessage(stream, { seq });
    if (m !== null) found.set(seq, m.header.get("Nats-Msg-Id"));
  }
  return found;
}

async function consumers(jsm: JetStreamManager): Promise<void> {
  const common = { ackWaitMs: 10_000, maxAckPending: 1_000 };
  await ensureDurableConsumer(jsm, {
    stream: subjects.streams.calls,
    name: subjects.resolverConsumer,
    maxDeliver: 20,
    ...common,
  });
  await ensureDurableConsumer(jsm, {
    stream: subjects.streams.work,
    name: subjects.workConsumer("t"),
    filterSubject: subjects.work("t"),
    maxDeliver: 6,
    ...common,
  });
}

let plane: MeshCallPlane;

beforeAll(async () => {
  server = await startNatsServer();
  // What the services had done before the server was killed.
  const before = await connect({ servers: server.url });
  const setup = await openCallPlane(before, { subjects });
  await consumers(setup.jsm);
  const js = setup.js;
  for (const id of ["c1", "c2", "c3", "c4"])
    await js.publish(subjects.call(address), JSON.stringify(request(id)), { msgID: `s/${id}` });
  // c4 was refused: answered, with no record.
  await js.publish(
    subjects.result(address, "c4"),
    JSON.stringify({
      role: "tool",
      tool_call_id: "c4",
      name: "t",
      content: "refused",
      session_id: "s",
    }),
  );
  for (const id of ["w1", "w2"])
    await js.publish(subjects.work("t"), JSON.stringify(work(id)), { msgID: `s/${id}` });
  // Ended: c1, w1. Accepted and not ended: c2. No record: c3 (never taken by a resolver, or
  // given up by its consumer), c4 (refused), w2.
  for (const [id, state] of [
    ["c1", "done"],
    ["w1", "done"],
    ["c2", "accepted"],
  ] as const)
    await setup.store.accept(record(id, state));
  await before.close();

  const streams = [subjects.streams.calls, subjects.streams.work];
  await leaveOrphans(server, streams, async () => {
    const acker = await connect({ servers: server.url });
    const ajs = jetstream(acker);
    for (const [stream, consumer] of [
      [subjects.streams.calls, subjects.resolverConsumer],
      [subjects.streams.work, subjects.workConsumer("t")],
    ] as const) {
      const c = await ajs.consumers.get(stream, consumer);
      for (;;) {
        const m = await c.next({ expires: 1_000 });
        if (m === null) break;
        await m.ackAck();
      }
    }
    await acker.close();
  });
  nc = await connect({ servers: server.url });
  plane = await openCallPlane(nc, { subjects });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

describe("reconciliation of orphaned messages", () => {
  it("finds acknowledged messages back in the work queues, below their consumers' ack floors", async () => {
    const jsm = await jetstreamManager(nc);
    expect([...(await contents(jsm, subjects.streams.calls)).keys()]).toEqual([1, 2, 3, 4]);
    expect([...(await contents(jsm, subjects.streams.work)).keys()]).toEqual([1, 2]);
    const work = await jsm.consumers.info(subjects.streams.work, subjects.workConsumer("t"));
    expect(work.ack_floor.stream_seq).toBe(2);
    expect(work.num_pending).toBe(0);
  });

  it("removes those of ended calls, leaves open work to the keepers, and on a second pass removes calls taken and answers a call nobody took", async () => {
    const { jsm, store } = plane;
    const suspects = [new Set<string>(), new Set<string>()];
    // Two resolvers reconciling at once: each message is acted on once.
    const first = await Promise.all(
      suspects.map((s) =>
        reconcileOrphans({ jsm, js: plane.js, subjects, store, log, suspects: s }),
      ),
    );
    expect(first.reduce((n, o) => n + o.deleted, 0)).toBe(2); // c1, w1

    expect([...(await contents(jsm, subjects.streams.work)).values()]).toEqual(["s/w2"]);
    // w2's call has not ended: it may be work its consumer gave up on, which the dead-letter
    // keeper moves (and the deadline keeper removes at the deadline). It stays.
    // Below the floor, its consumer never delivers it again; the deadline keeper, which reads
    // the stream itself, still watches it.
    const keeper = await startDeadlineKeeper({ nc, plane, subjects, log });
    await keeper.replay();
    expect(keeper.watched).toBe(1);
    keeper.stop();

    // c2, c3 and c4 have not ended: the first pass only suspects them (the dead-letter keeper
    // comes first for calls their consumer gave up on).
    expect([...(await contents(jsm, subjects.streams.calls)).values()]).toEqual([
      "s/c2",
      "s/c3",
      "s/c4",
    ]);
    const second = await reconcileOrphans({
      jsm,
      js: plane.js,
      subjects,
      store,
      log,
      suspects: suspects[0],
    });
    expect(second).toMatchObject({ found: 4, deleted: 3 });
    expect((await contents(jsm, subjects.streams.calls)).size).toBe(0);
    // c2 was routed (it has a record) and c4 answered: removed. c3 was never taken: it is
    // answered, retryable, before it goes.
    const answer = await jsm.streams.getMessage(subjects.streams.sessions, {
      last_by_subj: subjects.result(address, "c3"),
    });
    expect(answer?.json<ToolMessage>()).toMatchObject({
      tool_call_id: "c3",
      name: "t",
      session_id: "s",
      error: { code: "unavailable", retryable: true },
    });
    expect((await jsm.streams.info(subjects.streams.work)).state.messages).toBe(1);
  });
});
