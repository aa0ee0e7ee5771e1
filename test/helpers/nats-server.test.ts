import { existsSync } from "node:fs";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { afterAll, describe, expect, it } from "vitest";
import { NatsServerStartError, natsMode, startNatsServer, stopAll } from "./nats-server.js";

afterAll(async () => {
  await stopAll();
});

// The process launcher itself; the container launcher has its own test (test/docker/).
describe.skipIf(natsMode === "container")("startNatsServer", () => {
  it("starts on a random local port with JetStream enabled", async () => {
    const server = await startNatsServer();
    try {
      expect(server.url).toBe(`nats://127.0.0.1:${server.port}`);
      expect(server.port).not.toBe(4222);
      expect(server.monitorUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      expect(server.pid).toBeGreaterThan(0);

      const nc = await connect({ servers: server.url });
      try {
        expect(nc.info?.version).toMatch(/^2\./);
        const jsm = await jetstreamManager(nc);
        const account = await jsm.getAccountInfo();
        expect(account.streams).toBe(0);
      } finally {
        await nc.close();
      }

      const jsz = await server.jsz();
      expect(jsz.config.store_dir).toBe(`${server.storeDir}/jetstream`);
    } finally {
      await server.stop();
    }
  });

  it("keeps streams across kill and restart on the same port", async () => {
    const server = await startNatsServer();
    try {
      const nc = await connect({ servers: server.url });
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "PERSISTED", subjects: ["persisted.>"] });
      const js = jsm.jetstream();
      await js.publish("persisted.one", "hello");
      await nc.close();

      const { port, url, pid } = server;
      await server.kill();
      expect(server.running).toBe(false);
      expect(existsSync(server.storeDir)).toBe(true);

      await server.restart();
      expect(server.running).toBe(true);
      expect(server.port).toBe(port);
      expect(server.pid).not.toBe(pid);

      const nc2 = await connect({ servers: url });
      try {
        const jsm2 = await jetstreamManager(nc2);
        const info = await jsm2.streams.info("PERSISTED");
        expect(info.state.messages).toBe(1);
      } finally {
        await nc2.close();
      }

      const jsz = await server.jsz();
      expect(jsz.streams).toBe(1);
    } finally {
      await server.stop();
    }
  });

  it("restart() of a running server lets clients reconnect to the same URL", async () => {
    const server = await startNatsServer();
    const nc = await connect({
      servers: server.url,
      reconnectTimeWait: 50,
      maxReconnectAttempts: -1,
    });
    try {
      const reconnected = (async () => {
        for await (const status of nc.status()) {
          if (status.type === "reconnect") return true;
        }
        return false;
      })();
      await server.restart();
      expect(await reconnected).toBe(true);
      const jsm = await jetstreamManager(nc);
      await expect(jsm.getAccountInfo()).resolves.toBeDefined();
    } finally {
      await nc.close();
      await server.stop();
    }
  });

  it("stop() ends the process and removes the temp dir", async () => {
    const server = await startNatsServer();
    const pid = server.pid;
    await server.stop();
    expect(server.running).toBe(false);
    expect(existsSync(server.storeDir)).toBe(false);
    expect(() => process.kill(pid, 0)).toThrow();
    await expect(server.restart()).rejects.toThrow(/after stop/);
    await server.stop(); // idempotent
  });

  it("starts without JetStream and with extra config text", async () => {
    const server = await startNatsServer({
      jetstream: false,
      config: "max_payload: 65536\n",
    });
    try {
      const nc = await connect({ servers: server.url });
      try {
        expect(nc.info?.max_payload).toBe(65536);
        expect(nc.info?.jetstream ?? false).toBe(false);
      } finally {
        await nc.close();
      }
    } finally {
      await server.stop();
    }
  });

  it("reports the server's stderr when it cannot start", async () => {
    const failure = startNatsServer({ config: "this is { not valid" });
    await expect(failure).rejects.toBeInstanceOf(NatsServerStartError);
    await expect(failure).rejects.toThrow(/exited early/);
  });

  it("reload() applies new configuration text, and rejects text the server refuses", async () => {
    const server = await startNatsServer({
      jetstream: false,
      config: 'authorization { users: [{ user: "a", password: "a" }] }',
    });
    try {
      await expect(connect({ servers: server.url, user: "b", pass: "b" })).rejects.toThrow();
      await server.reload(
        'authorization { users: [{ user: "a", password: "a" }, { user: "b", password: "b" }] }',
      );
      const nc = await connect({ servers: server.url, user: "b", pass: "b" });
      await nc.close();
      await expect(server.reload("authorization { users: [")).rejects.toThrow(/reload/i);
    } finally {
      await server.stop();
    }
  });

  it("runs the binary it is given, and names it when it is missing", async () => {
    await expect(startNatsServer({ executable: "/nonexistent/nats-server" })).rejects.toThrow(
      "/nonexistent/nats-server not found",
    );
  });

  it("stopAll() kills servers left running", async () => {
    const server = await startNatsServer();
    await stopAll();
    expect(server.running).toBe(false);
    expect(existsSync(server.storeDir)).toBe(false);
  });
});
