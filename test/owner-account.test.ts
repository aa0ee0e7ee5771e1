import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { SessionEvent } from "@toolmesh/client";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Executor, ToolModule } from "@toolmesh/tool-host";
import type { Bridge } from "@toolmesh/mcp-bridge";
import { McpServerConfigSchema, startBridge } from "@toolmesh/mcp-bridge";
import { meshToolName } from "@toolmesh/mcp-bridge/internal";
import { startExecutor } from "@toolmesh/tool-host";
import type { Resolver } from "@toolmesh/resolver";
import { startResolver } from "@toolmesh/resolver";
import { ToolRegistry } from "@toolmesh/registry";
import { createSubjects } from "@toolmesh/protocol";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";

// An executor in a tool owner's account (ADR 0031), which has no JetStream, runs calls end to
// end: it registers through the owner services, pulls and acks through its account's imports
// below `{p}.js.API`, sends progress and ends calls through the mesh, and hears cancellations.
// Runs on whichever nats-server is first on the PATH (CI runs it on 2.9.10 and the current).
const subjects = createSubjects({ prefix: "acct" });
const log = createLogger({ service: "test", level: "silent" });

// The tools of the test MCP server, served by a bridge of the same owner.
const TEST_SERVER = join(
  fileURLToPath(new URL(".", import.meta.url)),
  "fixtures/mcp/test-server.mjs",
);
const MCP_TOOLS = [
  "echo",
  "greet",
  "whoami",
  "count",
  "slow",
  "fail",
  "rpc_error",
  "crash",
  "add_tool",
  "remove_tool",
  "mixed",
  "wrapped",
  "http_error",
  "target",
  "redefine",
  "math.add",
  "expire_session",
];

let server: NatsServerHandle;
let mesh: NatsConnection;
let owner: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let executor: Executor;
let client: ToolmeshClient;
let releaseSlow: () => void = () => undefined;

const tools: ToolModule[] = [
  {
    name: "echo",
    description: "Echoes its text, with progress.",
    parameters: {
      type: "object",
      properties: { text: { type: "string" } },
      required: ["text"],
    },
    progress: true,
    handler: (args: Record<string, unknown>, ctx) => {
      ctx.emit({ step: "echoing" });
      return { echoed: args.text };
    },
  },
  {
    name: "slow",
    description: "Waits until cancelled.",
    parameters: { type: "object", properties: {} },
    handler: (_args, ctx) =>
      new Promise((resolve, reject) => {
        releaseSlow = () => resolve("released");
        ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason as Error));
      }),
  },
];

beforeAll(async () => {
  server = await startNatsServer({
    config: ownerAccountsConfig(subjects, {
      acme: [...tools.map((t) => t.name), ...MCP_TOOLS.map((t) => meshToolName("t", t))],
    }),
  });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  owner = await connect({
    servers: server.url,
    user: "executor-acme",
    pass: "executor-acme",
    inboxPrefix: subjects.ownerInboxPrefix("executor", "acme"),
  });
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  // The executor starts first: its registration waits for the owner services.
  const starting = startExecutor({ nc: owner, subjects, ownerAccount: "acme", tools, log, tracer });
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer });
  executor = await starting;
  client = new ToolmeshClient(mesh, { prefix: "acct", defaultTimeoutMs: 15_000 });
}, 60_000);

afterAll(async () => {
  await executor?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh?.close(), owner?.close()]);
  await server?.stop();
});

describe("an executor in a tool owner's account", () => {
  it("registers its tools under its owner", async () => {
    expect(executor.tools).toEqual(["echo", "slow"]);
    expect((await registry.fetch("echo"))?.owner).toBe("acme");
  });

  it("runs a call end to end, progress included", async () => {
    const session = client.session("s1");
    const events: SessionEvent[] = [];
    session.onEvent((e) => events.push(e));
    const message = await session.submit({ id: "c1", name: "echo", arguments: { text: "hi" } })
      .result;
    expect(message.error).toBeUndefined();
    expect(JSON.parse(message.content)).toEqual({ echoed: "hi" });
    expect(events.some((e) => e.type === "progress")).toBe(true);
    session.close();
  });

  it("hears a cancellation and ends the call as cancelled", async () => {
    const session = client.session("s2");
    const handle = session.submit({ id: "c2", name: "slow", arguments: {} });
    for (let i = 0; executor.inFlight().length === 0; i++) {
      if (i === 200) throw new Error("the slow call never started");
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    await handle.cancel();
    const message = await handle.result;
    expect(message.error?.code).toBe("cancelled");
    releaseSlow();
    session.close();
  });

  it("serves an MCP server's tools from a bridge of the same owner", async () => {
    const bridgeNc = await connect({
      servers: server.url,
      user: "mcp-bridge-acme",
      pass: "mcp-bridge-acme",
      inboxPrefix: subjects.ownerInboxPrefix("mcp-bridge", "acme"),
    });
    let bridge: Bridge | undefined;
    try {
      bridge = await startBridge({
        nc: bridgeNc,
        subjects,
        ownerAccount: "acme",
        servers: [
          McpServerConfigSchema.parse({
            name: "t",
            transport: "stdio",
            command: process.execPath,
            args: [TEST_SERVER],
          }),
        ],
        env: {},
        log,
        tracer: initTelemetry({ serviceName: "test", env: {} }).tracer,
      });
      for (let i = 0; registry.get("t.echo")?.definition.owner !== "acme"; i++) {
        if (i === 400) throw new Error("t.echo was never registered");
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      const session = client.session("s3");
      const message = await session.submit({
        id: "c3",
        name: "t.echo",
        arguments: { text: "through the bridge" },
      }).result;
      expect(message.error).toBeUndefined();
      expect(message.content).toContain("through the bridge");
      session.close();
    } finally {
      await bridge?.stop(1_000);
      await bridgeNc.close();
    }
  });
});
