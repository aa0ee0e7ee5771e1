import { afterAll, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { followStatus } from "@toolmesh/nats";
import { natsMode, startNatsServer, stopAll } from "./helpers/nats-server.js";
import { until } from "./helpers/eventually.js";

afterAll(async () => {
  await stopAll();
});

// A part of a process (an executor, an audit trail, a resolver) that stops while its connection
// stays open stops hearing the connection's status changes.
describe.skipIf(natsMode === "container")("followStatus", () => {
  it("hands each drop and return to its handlers until stopped", async () => {
    const server = await startNatsServer();
    const nc = await connect({
      servers: server.url,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 50,
    });
    try {
      const heard = { kept: [] as string[], stopped: [] as string[] };
      followStatus(nc, {
        disconnect: () => void heard.kept.push("disconnect"),
        reconnect: () => void heard.kept.push("reconnect"),
      });
      const stop = followStatus(nc, {
        disconnect: () => void heard.stopped.push("disconnect"),
        reconnect: () => void heard.stopped.push("reconnect"),
      });
      stop();

      await server.kill();
      await server.restart();
      await until("the connection is back", () => heard.kept.includes("reconnect"), {
        timeoutMs: 20_000,
      });

      expect(heard.kept).toEqual(["disconnect", "reconnect"]);
      expect(heard.stopped).toEqual([]);
    } finally {
      await nc.close();
      await server.stop();
    }
  });
});
