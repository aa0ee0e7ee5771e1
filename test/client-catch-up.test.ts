import { afterAll, beforeAll, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import { ensureStreams } from "@toolmesh/nats";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startTcpProxy } from "./helpers/tcp-proxy.js";
import type { TcpProxy } from "./helpers/tcp-proxy.js";
import { eventually } from "./helpers/eventually.js";

// A frontend that reconnects reads the stored answers of the calls it still waits for
// (docs/protocol.md, "Submitting a call"). Here the test plays the mesh: it stores the answer
// while the frontend is away, so only that read can deliver it.
const subjects = createSubjects();

let server: NatsServerHandle;
let proxy: TcpProxy;
let admin: NatsConnection;
let jsm: JetStreamManager;

beforeAll(async () => {
  server = await startNatsServer();
  proxy = await startTcpProxy(server.port);
  admin = await connect({ servers: server.url });
  jsm = await ensureStreams(admin, subjects);
});

afterAll(async () => {
  await admin?.close();
  await proxy?.close();
  await server?.stop();
});

it("reads a waiting call's answer after a reconnect whose first read of it failed", async () => {
  const nc = await connect({
    servers: `127.0.0.1:${proxy.port}`,
    reconnectTimeWait: 100,
    reconnectJitter: 0,
    maxReconnectAttempts: -1,
  });
  try {
    // Reads that find no responder fail at once on a current server and time out on 2.9.
    const session = new ToolmeshClient(nc, { requestTimeoutMs: 500 }).session("away");
    let settled: ToolMessage | undefined;
    const handle = session.submit(
      { id: "c1", name: "lookup", arguments: { q: "x" } },
      { timeoutMs: 10_000 },
    );
    void handle.result.then((message) => (settled = message));
    await eventually("the call stored", async () =>
      (await jsm.streams.info(subjects.streams.calls)).state.messages === 1 ? true : undefined,
    );

    await proxy.cut();
    // Stored while the frontend is away: no subscription sees it live.
    const answer: ToolMessage = {
      role: "tool",
      tool_call_id: "c1",
      name: "lookup",
      session_id: "away",
      content: "stored while away",
    };
    await jetstream(admin).publish(subjects.result(session.address, "c1"), encodeJson(answer));
    // And unreadable by direct get when the frontend comes back: its first read fails.
    await jsm.streams.update(subjects.streams.sessions, { allow_direct: false });
    const reconnected = (async () => {
      for await (const status of nc.status()) if (status.type === "reconnect") return;
    })();
    await proxy.restore();
    await reconnected;
    // Long enough for both reads of the catch-up (the submission's rejection, then its result)
    // to fail.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(settled).toBeUndefined();

    await jsm.streams.update(subjects.streams.sessions, { allow_direct: true });
    expect(await handle.result).toMatchObject({ tool_call_id: "c1", content: "stored while away" });
    session.close();
  } finally {
    await nc.close();
  }
});
