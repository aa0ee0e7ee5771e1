import { afterAll, beforeAll, expect, it } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { SessionEvent } from "@toolmesh/client";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startTcpProxy } from "./helpers/tcp-proxy.js";
import type { TcpProxy } from "./helpers/tcp-proxy.js";

// The resolver counts a session's calls in flight until it sees their final messages
// (TOOLMESH_SESSION_MAX_IN_FLIGHT). Final messages published while it was disconnected never
// reach it: it must not keep counting those calls once it is back.
const LIMIT = 4;

let server: NatsServerHandle;
let proxy: TcpProxy;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let ledgerDir: string;

beforeAll(async () => {
  server = await startNatsServer();
  proxy = await startTcpProxy(server.port);
  ledgerDir = mkdtempSync(join(tmpdir(), "toolmesh-ledger-"));
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    TOOLMESH_SESSION_MAX_IN_FLIGHT: String(LIMIT),
  };
  // Only the resolver goes through the proxy: cutting it leaves the executor and the caller on.
  resolver = await startService("resolver", {
    ...env,
    NATS_URL: `nats://127.0.0.1:${proxy.port}`,
  });
  await startService("executor", env);
  await toolAvailable(resolver, "sleepy");
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc, { deadlineGraceMs: 10_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await proxy?.close();
  await server?.stop();
  rmSync(ledgerDir, { recursive: true, force: true });
});

it("gives a session its whole in-flight limit again after calls ended while the resolver was disconnected", async () => {
  const session = client.session("away");
  const running = new Set<string>();
  const allRunning = new Promise<void>((resolve) => {
    session.onEvent((e: SessionEvent) => {
      if (e.type !== "progress") return;
      running.add(e.event.tool_call_id);
      if (running.size === LIMIT) resolve();
    });
  });
  const first = Array.from({ length: LIMIT }, (_, i) =>
    session.submit({ id: `a${i}`, name: "sleepy", arguments: { ms: 1_000 } }),
  );
  await allRunning;
  await proxy.cut();
  // They end, and their final messages go out, while the resolver cannot hear them.
  const ended = await Promise.all(first.map((h) => h.result));
  expect(ended.map((m) => m.error?.code ?? "ok")).toEqual(Array(LIMIT).fill("ok"));
  const reconnects = resolver.lines.filter((l) => l.msg === "reconnected to NATS").length;
  await proxy.restore();
  await expect
    .poll(() => resolver.lines.filter((l) => l.msg === "reconnected to NATS").length, {
      timeout: 10_000,
    })
    .toBe(reconnects + 1);

  const again = Array.from({ length: LIMIT }, (_, i) =>
    session.submit({ id: `b${i}`, name: "sleepy", arguments: { ms: 500 } }),
  );
  const messages = await Promise.all(again.map((h) => h.result));
  session.close();
  expect(messages.map((m) => m.error?.code ?? "ok")).toEqual(Array(LIMIT).fill("ok"));
});
