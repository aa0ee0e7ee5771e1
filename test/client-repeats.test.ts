import v8 from "node:v8";
import vm from "node:vm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import type { SessionEvent } from "@toolmesh/client";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { ensureStreams } from "@toolmesh/nats";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { eventually } from "./helpers/eventually.js";

// A session drops a final message it already delivered (live, then again from the stream after
// a reconnect) and delivers a different one for the same call (an operator's replay); what it
// remembers to tell them apart stays small whatever the results weigh (docs/protocol.md,
// "Submitting a call"). The test plays the mesh: it publishes the final messages itself.
const subjects = createSubjects();

let server: NatsServerHandle;
let admin: NatsConnection;
let jsm: JetStreamManager;

beforeAll(async () => {
  server = await startNatsServer();
  admin = await connect({ servers: server.url });
  jsm = await ensureStreams(admin, subjects);
});

/** Calls stored in the calls stream so far. */
async function callsStored(): Promise<number> {
  return (await jsm.streams.info(subjects.streams.calls)).state.messages;
}

/**
 * Waits until the calls stream holds `count` calls: the session's subscription, sent on the same
 * connection before its submissions, is then in place to receive their answers live.
 */
async function stored(count: number): Promise<void> {
  await eventually(`${count} calls stored`, async () =>
    (await callsStored()) >= count ? true : undefined,
  );
}

afterAll(async () => {
  await admin?.close();
  await server?.stop();
});

function answer(callId: string, session: string, content: string): ToolMessage {
  return { role: "tool", tool_call_id: callId, name: "lookup", session_id: session, content };
}

/** Collects garbage (exposed for this test) and reads the heap in use. */
function heapAfterGc(): number {
  v8.setFlagsFromString("--expose-gc");
  (vm.runInNewContext("gc") as () => void)();
  return process.memoryUsage().heapUsed;
}

describe("a session's final messages", () => {
  it("are delivered once each, and a different one for the same call again", async () => {
    const nc = await connect({ servers: server.url });
    try {
      const session = new ToolmeshClient(nc).session("repeats");
      const results: string[] = [];
      session.onEvent((event: SessionEvent) => {
        if (event.type === "result") results.push(event.message.content);
      });
      const before = await callsStored();
      const handle = session.submit({ id: "c1", name: "lookup", arguments: { q: "x" } });
      await stored(before + 1);
      const js = jetstream(admin);
      const subject = subjects.result(session.address, "c1");
      await js.publish(subject, encodeJson(answer("c1", "repeats", "first")));
      expect((await handle.result).content).toBe("first");
      await js.publish(subject, encodeJson(answer("c1", "repeats", "first")));
      await js.publish(subject, encodeJson(answer("c1", "repeats", "replayed")));
      // Published after the copy on the same subject: once the replay is seen, so was the copy.
      await eventually("the replay delivered", () =>
        results.includes("replayed") ? true : undefined,
      );
      expect(results).toEqual(["first", "replayed"]);
      session.close();
    } finally {
      await nc.close();
    }
  });

  it("are remembered by digest: 64 results of 512 KB leave the heap about as it was", async () => {
    const nc = await connect({ servers: server.url });
    try {
      const session = new ToolmeshClient(nc).session("large");
      const calls = 64;
      const submittedBefore = await callsStored();
      let settled = 0;
      // Only whether each call settled is kept: a handle holds its result.
      const done = Array.from({ length: calls }, (_, i) =>
        session
          .submit({ id: `big-${i}`, name: "lookup", arguments: { i } })
          .result.then(() => void settled++),
      );
      await stored(submittedBefore + calls);
      const before = heapAfterGc();
      const js = jetstream(admin);
      for (let i = 0; i < calls; i++) {
        const content = String.fromCharCode(97 + (i % 26)).repeat(512 * 1024);
        await js.publish(
          subjects.result(session.address, `big-${i}`),
          encodeJson(answer(`big-${i}`, "large", content)),
        );
      }
      await Promise.all(done);
      expect(settled).toBe(calls);
      // Keeping each result's text would hold 32 MB.
      const grown = heapAfterGc() - before;
      expect(grown).toBeLessThan(8 * 1024 * 1024);
      session.close();
    } finally {
      await nc.close();
    }
  });
});
