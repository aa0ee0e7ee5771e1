// The container launcher of the integration tests (TOOLMESH_TEST_NATS=container): the same
// handle as the process launcher, with a real nats-server in a container.
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { afterAll, describe, expect, it } from "vitest";
import { NatsServerStartError } from "../helpers/nats-server.js";
import {
  startContainerNatsServer,
  stopAllContainerNatsServers,
} from "../helpers/nats-container.js";
import { dockerEngine } from "./docker.js";

const engine = await dockerEngine();
if (!engine.ok) console.warn(`!! NATS CONTAINER TESTS NOT RUN: no Docker engine (${engine.why})`);

afterAll(async () => {
  if (engine.ok) await stopAllContainerNatsServers();
});

describe.skipIf(!engine.ok)("startContainerNatsServer", () => {
  it("serves JetStream on a fixed URL, and keeps streams across kill and restart", async () => {
    const server = await startContainerNatsServer();
    expect(server.url).toBe(`nats://127.0.0.1:${server.port}`);
    const nc = await connect({ servers: server.url });
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "PERSISTED", subjects: ["persisted.>"] });
    await jsm.jetstream().publish("persisted.one", "hello");
    await nc.close();
    expect((await server.jsz()).config.store_dir).toBe(`${server.storeDir}/jetstream`);

    await server.kill();
    expect(server.running).toBe(false);
    await expect(connect({ servers: server.url, reconnect: false })).rejects.toThrow();

    await server.restart();
    expect(server.running).toBe(true);
    const nc2 = await connect({ servers: server.url });
    const info = await (await jetstreamManager(nc2)).streams.info("PERSISTED");
    expect(info.state.messages).toBe(1);
    await nc2.close();
    await server.stop();
    expect(server.running).toBe(false);
    await expect(server.restart()).rejects.toThrow(/after stop/);
  });

  it("takes extra configuration text and can run without JetStream", async () => {
    const server = await startContainerNatsServer({
      jetstream: false,
      config: "max_payload: 65536\n",
    });
    const nc = await connect({ servers: server.url });
    expect(nc.info?.max_payload).toBe(65536);
    expect(nc.info?.jetstream ?? false).toBe(false);
    await nc.close();
    await server.stop();
  });

  it("reports a server that cannot start", async () => {
    const failure = startContainerNatsServer({
      config: "this is { not valid",
      startTimeoutMs: 20_000,
    });
    await expect(failure).rejects.toBeInstanceOf(NatsServerStartError);
  });
});
