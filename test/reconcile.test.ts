import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import {
  AckPolicy,
  DeliverPolicy,
  RetentionPolicy,
  jetstream,
  jetstreamManager,
} from "@nats-io/jetstream";
import { CallStore } from "@toolmesh/call-store";
import { createSubjects } from "@toolmesh/protocol";
import type { ResolvedCall } from "@toolmesh/protocol";
import { reconcileOrphans } from "@toolmesh/resolver";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// Orphans (acknowledged messages that reappear below their consumer's ack floor after a server
// is killed) cannot be made on purpose in a work-queue stream. The same situation is built here
// in a limits stream, whose consumers may start past existing messages: those messages then
// sit below the consumer's ack floor, exactly where orphans sit.
let server: NatsServerHandle;
let nc: NatsConnection;
let js: JetStreamClient;
let jsm: JetStreamManager;
const subjects = createSubjects({ prefix: "orphans" });

function call(id: string): ResolvedCall {
  return {
    call_id: id,
    tool_call_id: id,
    idempotency_key: `s/${id}`,
    session_id: "s",
    address: { tenant: "default", session: "s" },
    tool: "t",
    arguments: {},
    missing_required: [],
    missing_optional: [],
    input_parameters: [],
    context: {},
    agent_context: {},
    timeout_ms: 60_000,
    deadline_at: Date.now() + 60_000,
    resolved_at: Date.now(),
    tool_revision: 1,
  };
}

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  js = jetstream(nc);
  jsm = await jetstreamManager(nc);
  for (const [name, subject] of [
    [subjects.streams.calls, subjects.allCalls],
    [subjects.streams.work, subjects.allWork],
  ] as const) {
    await jsm.streams.add({ name, subjects: [subject], retention: RetentionPolicy.Limits });
  }
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

describe("reconciliation of orphaned messages", () => {
  it("puts orphans back in line once, and drops those whose call already ended", async () => {
    const store = await CallStore.open(nc, { subjects });
    const ids = ["o1", "o2", "o3"];
    for (const id of ids) {
      await js.publish(subjects.work("t"), JSON.stringify(call(id)), { msgID: `s/${id}` });
    }
    // o2 ended before its acknowledgement was lost.
    await store.accept({
      idempotency_key: "s/o2",
      call_id: "o2",
      session_id: "s",
      address: { tenant: "default", session: "s" },
      tool: "t",
      args_hash: "h",
      state: "done",
      deadline_at: Date.now() + 60_000,
      result: { role: "tool", tool_call_id: "o2", name: "t", content: "done", session_id: "s" },
    });
    await jsm.consumers.add(subjects.streams.work, {
      durable_name: subjects.workConsumer("t"),
      filter_subject: subjects.work("t"),
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: 4,
    });
    // A fourth call is delivered and acknowledged, which moves the ack floor to 4; as a work
    // queue would, the acknowledged message is removed.
    await js.publish(subjects.work("t"), JSON.stringify(call("o4")), { msgID: "s/o4" });
    const first = await (
      await js.consumers.get(subjects.streams.work, subjects.workConsumer("t"))
    ).next({ expires: 2_000 });
    expect(first?.seq).toBe(4);
    await first?.ackAck();
    await jsm.streams.deleteMessage(subjects.streams.work, 4);
    expect(
      (await jsm.consumers.info(subjects.streams.work, subjects.workConsumer("t"))).ack_floor
        .stream_seq,
    ).toBe(4);
    const log = createLogger({ service: "test", level: "silent" });

    // Two resolvers reconciling at once must not put an orphan back twice.
    const found = await Promise.all([
      reconcileOrphans({ js, jsm, subjects, store, log }),
      reconcileOrphans({ js, jsm, subjects, store, log }),
    ]);
    expect(Math.max(...found)).toBe(3);

    const state = (await jsm.streams.info(subjects.streams.work)).state;
    expect(state.messages).toBe(2);
    const again = [];
    for (let seq = state.first_seq; seq <= state.last_seq; seq++) {
      const m = await jsm.streams.getMessage(subjects.streams.work, { seq }).catch(() => null);
      if (m !== null)
        again.push({ id: m.json<ResolvedCall>().call_id, msgId: m.header.get("Nats-Msg-Id") });
    }
    expect(again.sort((a, b) => a.id.localeCompare(b.id))).toEqual([
      { id: "o1", msgId: "s/o1#orphan-1" },
      { id: "o3", msgId: "s/o3#orphan-3" },
    ]);
    // Put back after the ack floor: the consumer delivers them.
    const consumer = await js.consumers.get(subjects.streams.work, subjects.workConsumer("t"));
    const delivered = [];
    for (let i = 0; i < 2; i++) {
      const m = await consumer.next({ expires: 2_000 });
      if (m !== null) {
        delivered.push(m.json<ResolvedCall>().call_id);
        m.ack();
      }
    }
    expect(delivered.sort()).toEqual(["o1", "o3"]);
  });
});
