import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let env: Record<string, string>;

beforeAll(async () => {
  server = await startNatsServer();
  env = { NATS_URL: server.url, TOOLMESH_TOOLS_DIR: fixtureTools("tools-c") };
  const resolver = await startService("resolver", env);
  await startService("executor", { ...env, TOOLMESH_CONCURRENCY: "2" });
  await toolAvailable(resolver, "concurrency");
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc);
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("executor limits", () => {
  it("never runs more calls at once than its concurrency cap", async () => {
    const session = client.session("s-cap");
    const messages = await session.submitAll(
      Array.from({ length: 8 }, (_, i) => ({
        id: `c${i}`,
        name: "concurrency",
        arguments: { hold_ms: 80 },
      })),
    ).results;
    session.close();
    const seen = messages.map((m) => (JSON.parse(m.content) as { seen: number }).seen);
    expect(Math.max(...seen)).toBe(2);
  });

  it("answers deadline_exceeded when no executor serves the tool any more", async () => {
    const resolverEnv = {
      ...env,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-b"),
      TOOLMESH_EXECUTOR_OWNER: "gone",
    };
    const gone = await startService("executor", resolverEnv);
    await gone.stop();
    const session = client.session("s-orphan");
    const started = Date.now();
    const message = await session.submit(
      { id: "o1", name: "late.arrival", arguments: {} },
      { timeoutMs: 400 },
    ).result;
    session.close();
    expect(message.error).toMatchObject({ code: "deadline_exceeded" });
    expect(Date.now() - started).toBeGreaterThanOrEqual(400);
  });
});
