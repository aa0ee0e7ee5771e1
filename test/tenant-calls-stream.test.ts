import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import { randomUUID } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { provisionTenantCalls } from "@toolmesh/nats";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startLedgerMesh } from "./helpers/mesh.js";

// A tenant's own calls stream (ADR 0048), as the mesh account sees it: a stream made after the
// resolvers started is read with no restart, through their one intake subscription; a client
// with `tenantStream` (the MCP gateway's) stores its calls there, and in the mesh's calls stream
// for a tenant without one; what cannot be answered is dead-lettered naming the tenant's stream.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
let server: NatsServerHandle;
let nc: NatsConnection;
let jsm: JetStreamManager;
let ledgerDir: string;

beforeAll(async () => {
  server = await startNatsServer();
  ({ ledgerDir } = await startLedgerMesh(server.url, "sleepy"));
  nc = await connect({ servers: server.url });
  jsm = await jetstreamManager(nc);
  // After the resolver started: it reads the stream without a restart.
  await provisionTenantCalls(nc, subjects, { ackWaitMs: 1_000 }, ["acme"]);
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
  rmSync(ledgerDir, { recursive: true, force: true });
});

/** The last sequence of a stream: how many messages it ever stored. */
async function lastSeq(stream: string): Promise<number> {
  return (await jsm.streams.info(stream)).state.last_seq;
}

describe("a tenant's own calls stream", () => {
  it("takes the calls of a client for that tenant, the mesh's stream those of a tenant without one until it has one", async () => {
    const shared = await lastSeq(subjects.streams.calls);
    const acme = new ToolmeshClient(nc, { tenant: "acme", tenantStream: true });
    const other = new ToolmeshClient(nc, { tenant: "other", tenantStream: true });
    const results = await Promise.all(
      [acme, other].flatMap((client) =>
        [0, 1, 2].map(
          (i) =>
            client.session(`s${i}`).submit({ name: "sleepy", arguments: { ms: 1, tag: `t${i}` } })
              .result,
        ),
      ),
    );
    expect(results.map((m) => m.error?.code ?? "ok")).toEqual(Array(6).fill("ok"));
    expect(await lastSeq(subjects.callsStream("acme"))).toBe(3);
    expect(await lastSeq(subjects.streams.calls)).toBe(shared + 3);
    // Both work queues are drained: every call was acknowledged by a resolver.
    expect((await jsm.streams.info(subjects.callsStream("acme"))).state.messages).toBe(0);
    const consumer = await jsm.consumers.info(subjects.callsStream("acme"), "resolver");
    expect(consumer.config.deliver_subject).toBe(subjects.intake);
    expect(consumer.num_ack_pending).toBe(0);

    // A stream made for the other tenant while its client runs takes its calls within seconds.
    await provisionTenantCalls(nc, subjects, { ackWaitMs: 1_000 }, ["other"]);
    const session = other.session("later");
    await expect
      .poll(
        async () => {
          await session.submit({ name: "sleepy", arguments: { ms: 1 } }).result;
          return lastSeq(subjects.callsStream("other"));
        },
        { timeout: 15_000, interval: 500 },
      )
      .toBeGreaterThan(0);
    session.close();
  });

  it("dead-letters a call on a subject no session maps to, naming the tenant's stream", async () => {
    const js = jetstream(nc);
    const stray = subjects.tenantStreamCall({ tenant: "acme", session: "*" });
    const ack = await js.publish(
      stray,
      encodeJson({
        tool_call: { id: "w1", type: "function", function: { name: "sleepy", arguments: "{}" } },
        session_id: "*",
      }),
      { msgID: randomUUID() },
    );
    expect(ack.stream).toBe(subjects.callsStream("acme"));
    for (;;) {
      const letter = await jsm.streams
        .getMessage(subjects.streams.dlq, { last_by_subj: subjects.dlq("sleepy") })
        .catch(() => null);
      if (letter?.header.get("Toolmesh-Dlq-Sequence") === String(ack.seq)) {
        expect(letter.header.get("Toolmesh-Dlq-Stream")).toBe(subjects.callsStream("acme"));
        expect(letter.header.get("Toolmesh-Dlq-Subject")).toBe(stray);
        expect(letter.header.get("Toolmesh-Dlq-Reason")).toBe("not a call subject");
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // Its max-deliveries advisories are kept like the mesh's, for the dead-letter keeper.
    const advisories = await jsm.streams.info(subjects.streams.advisories);
    expect(advisories.config.subjects).toContain(
      subjects.maxDeliveriesAdvisory(subjects.callsStream("acme")),
    );
  });
});
