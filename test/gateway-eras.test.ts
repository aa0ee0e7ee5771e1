import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import { z } from "zod";
import { META_TIMEOUT_MS } from "@toolmesh/gateway";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  startGateway,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The MCP SDK v2 client in each era → one gateway /mcp endpoint → resolver → executor.

const MODERN = "2026-07-28";
const PYTHON_CLIENT = join(
  dirname(fileURLToPath(import.meta.url)),
  "fixtures",
  "gateway",
  "python-client-modes.py",
);
let server: NatsServerHandle;
let gateway: { url: string };
const clients: Client[] = [];

type Era = "legacy" | typeof MODERN;

const TaskShape = z.object({ taskId: z.string(), status: z.string() }).loose();
const CreateTask = z.object({ task: TaskShape }).loose();

async function client(era: Era, key: string = KEYS.acme): Promise<Client> {
  const c = new Client(
    { name: "eras-test", version: "1.0.0" },
    { versionNegotiation: { mode: era === "legacy" ? "legacy" : { pin: MODERN } } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(gateway.url), {
    requestInit: { headers: { authorization: `Bearer ${key}` } },
  });
  await c.connect(transport);
  clients.push(c);
  return c;
}

/** A task-augmented tools/call on the wire (the SDK client has no Tasks extension runtime). */
async function modernTaskCall(
  key: string,
  args: Record<string, unknown>,
): Promise<z.infer<typeof CreateTask>> {
  const response = await fetch(gateway.url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${key}`,
      accept: "application/json, text/event-stream",
      "content-type": "application/json",
      "mcp-protocol-version": MODERN,
      "mcp-method": "tools/call",
      "mcp-name": "slow",
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "tools/call",
      params: {
        name: "slow",
        arguments: args,
        task: { ttl: 60_000 },
        _meta: {
          "io.modelcontextprotocol/protocolVersion": MODERN,
          "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
          "io.modelcontextprotocol/clientCapabilities": {
            extensions: { "io.modelcontextprotocol/tasks": {} },
          },
        },
      },
    }),
  });
  const body = (await response.json()) as { result?: unknown; error?: unknown };
  if (body.result === undefined) throw new Error(JSON.stringify(body));
  expect(body.result).toMatchObject({ resultType: "task" });
  return CreateTask.parse(body.result);
}

const text = (result: CallToolResult): string => (result.content[0] as { text: string }).text;

beforeAll(async () => {
  server = await startNatsServer();
  const [tools, configs, keys] = await Promise.all([
    gatewayTools(),
    gatewayAgents(),
    writeKeysFile(),
  ]);
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("schema-expander", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo", "slow", "strict");
  gateway = await startGateway({ ...env, ...keys.env, TOOLMESH_GATEWAY_KEYS_FILE: keys.file });
}, 150_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await killAllServices();
  await server?.stop();
});

describe.each<Era>(["legacy", MODERN])("the gateway to a %s client", (era) => {
  it("negotiates the era the client asked for", async () => {
    const c = await client(era);
    if (era === MODERN) expect(c.getNegotiatedProtocolVersion()).toBe(MODERN);
    else expect(c.getNegotiatedProtocolVersion()).not.toBe(MODERN);
  });

  it("lists the tenant's tools and calls one through the mesh", async () => {
    const c = await client(era);
    const { tools } = await c.listTools();
    expect(tools.map((t) => t.name)).toEqual(expect.arrayContaining(["echo", "slow", "strict"]));
    const result = await c.callTool({ name: "echo", arguments: { text: `hi ${era}` } });
    expect(result.isError).toBeFalsy();
    expect(text(result)).toContain(`hi ${era}`);
  });

  it("answers missing arguments with what is missing and the schema", async () => {
    const c = await client(era);
    const result = await c.callTool({ name: "slow", arguments: {} });
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toMatchObject({ code: "missing_arguments" });
    expect(text(result)).toContain("Missing required arguments: ms");
  });

  it("answers a typed error as an isError result", async () => {
    const c = await client(era);
    const result = await c.callTool({
      name: "slow",
      arguments: { ms: 5_000, value: "late" },
      _meta: { [META_TIMEOUT_MS]: 300 },
    });
    expect(result.isError).toBe(true);
    expect(result.structuredContent).toMatchObject({ code: "deadline_exceeded" });
  });

  it("answers an unknown tool with unknown_tool", async () => {
    const c = await client(era);
    const result = await c.callTool({ name: "no_such_tool", arguments: {} });
    expect(result.structuredContent).toMatchObject({ code: "unknown_tool" });
  });

  it("streams progress for a progress token", async () => {
    const c = await client(era);
    const seen: number[] = [];
    const result = await c.callTool(
      { name: "slow", arguments: { ms: 250, value: "p" } },
      { onprogress: (p) => seen.push(p.progress) },
    );
    expect(result.isError).toBeFalsy();
    expect(seen.length).toBeGreaterThan(0);
  });

  it("runs a task-augmented call as a mesh call: created once stored, polled, cancelled", async () => {
    const c = await client(era);
    const other = await client(era, KEYS.globex);
    const created =
      era === "legacy"
        ? await c.request(
            {
              method: "tools/call",
              params: {
                name: "slow",
                arguments: { ms: 30_000, value: "task" },
                task: { ttl: 60_000 },
              },
            },
            CreateTask,
          )
        : await modernTaskCall(KEYS.acme, { ms: 30_000, value: "task" });
    expect(created.task.status).toBe("working");
    const { taskId } = created.task;
    const got = await c.request({ method: "tasks/get", params: { taskId } }, TaskShape);
    expect(got).toMatchObject({ taskId, status: "working" });
    const foreign = await other
      .request({ method: "tasks/cancel", params: { taskId } }, TaskShape)
      .catch((err: unknown) => err as Error);
    const unknown = await other
      .request({ method: "tasks/cancel", params: { taskId: `${taskId}x` } }, TaskShape)
      .catch((err: unknown) => err as Error);
    // The same tenant's other credential is another principal: the task does not exist for it.
    const colleague = await client(era, KEYS.acmeWriter);
    const colleagues = await colleague
      .request({ method: "tasks/get", params: { taskId } }, TaskShape)
      .catch((err: unknown) => err as Error);
    const colleaguesUnknown = await colleague
      .request({ method: "tasks/get", params: { taskId: `${taskId}x` } }, TaskShape)
      .catch((err: unknown) => err as Error);
    expect(colleagues).toBeInstanceOf(Error);
    expect((colleagues as Error).message).toBe(
      (colleaguesUnknown as Error).message.replace(`${taskId}x`, taskId),
    );
    expect(foreign).toBeInstanceOf(Error);
    expect((foreign as Error).message).toBe(
      (unknown as Error).message.replace(`${taskId}x`, taskId),
    );
    expect(await c.request({ method: "tasks/get", params: { taskId } }, TaskShape)).toMatchObject({
      status: "working",
    });
    await c.request({ method: "tasks/cancel", params: { taskId } }, TaskShape);
    await expect
      .poll(
        async () =>
          (await c.request({ method: "tasks/get", params: { taskId } }, TaskShape)).status,
        {
          timeout: 15_000,
        },
      )
      .toBe("cancelled");
  });

  it("cancels the mesh call when the client abandons a call", async () => {
    const c = await client(era);
    const abort = new AbortController();
    const key = `abandon-${era}-${Date.now()}`;
    const started = new Promise<void>((resolve) => {
      void c
        .callTool(
          {
            name: "slow",
            arguments: { ms: 30_000, value: "x" },
            _meta: { "io.toolmesh/idempotency_key": key },
          },
          { signal: abort.signal, onprogress: () => resolve() },
        )
        .catch(() => undefined);
    });
    await started;
    abort.abort("the user changed their mind");
    // The same key names the same mesh call: its answer is the cancellation.
    const again = await c.callTool({
      name: "slow",
      arguments: { ms: 30_000, value: "x" },
      _meta: { "io.toolmesh/idempotency_key": key },
    });
    expect(again.structuredContent).toMatchObject({ code: "cancelled" });
  });

  it("answers a task id another tenant made as a task that does not exist", async () => {
    const c = await client(era);
    const other = await client(era, KEYS.globex);
    const missing = await c
      .request(
        { method: "tasks/get", params: { taskId: "gw-0000000000000000000000" } },
        z.object({}).loose(),
      )
      .catch((err: unknown) => err as Error);
    const foreign = await other
      .request(
        { method: "tasks/get", params: { taskId: "gw-0000000000000000000000" } },
        z.object({}).loose(),
      )
      .catch((err: unknown) => err as Error);
    expect(missing).toBeInstanceOf(Error);
    expect(foreign).toBeInstanceOf(Error);
    expect((foreign as Error).message).toBe((missing as Error).message);
  });
});

describe("the 2026-07-28 edge", () => {
  it("advertises the Tasks extension in server/discover", async () => {
    const c = await client(MODERN);
    const discovered = await c.discover();
    expect(discovered.capabilities.extensions).toHaveProperty("io.modelcontextprotocol/tasks");
    expect(discovered.supportedVersions).toContain(MODERN);
  });

  it("refuses an Mcp-Method header that disagrees with the body", async () => {
    const response = await fetch(gateway.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEYS.acme}`,
        accept: "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tools/list",
        params: {
          _meta: {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
            "io.modelcontextprotocol/clientCapabilities": {},
          },
        },
      }),
    });
    const body = (await response.json()) as { error?: { code: number; message: string } };
    expect(body.error?.message ?? "").toMatch(/Mcp-Method|header/i);
  });

  it("still checks the credential and origin before the SDK sees a request", async () => {
    const unauthenticated = await fetch(gateway.url, {
      method: "POST",
      headers: {
        accept: "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
      },
      body: "{}",
    });
    expect(unauthenticated.status).toBe(401);
    const foreignOrigin = await fetch(gateway.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEYS.acme}`,
        origin: "http://evil.example",
        accept: "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
      },
      body: "{}",
    });
    expect(foreignOrigin.status).toBe(403);
  });
});

describe.each(["legacy", "auto", MODERN])("the Python MCP SDK's Client in mode %s", (mode) => {
  it("lists, calls, gets typed errors and progress", async () => {
    const { stdout } = await promisify(execFile)(
      "python3",
      [PYTHON_CLIENT, gateway.url, KEYS.acme, mode],
      { timeout: 60_000 },
    );
    const out = JSON.parse(stdout) as {
      version: string;
      tools: string[];
      echo: { isError: boolean; text: string };
      missing: { code: string };
      unknown: { code: string };
      progress: { isError: boolean; events: number };
    };
    if (mode === "legacy") expect(out.version).not.toBe(MODERN);
    else expect(out.version).toBe(MODERN);
    expect(out.tools).toEqual(expect.arrayContaining(["echo", "slow", "strict"]));
    expect(out.echo).toEqual({ isError: false, text: `python ${mode}` });
    expect(out.missing.code).toBe("missing_arguments");
    expect(out.unknown.code).toBe("unknown_tool");
    expect(out.progress.isError).toBe(false);
    expect(out.progress.events).toBeGreaterThan(0);
  });
});

describe.each<Era>(["legacy", MODERN])("a %s task across a NATS restart", (era) => {
  it("is still answered, and completes, after nats-server restarts", async () => {
    const c = await client(era);
    const args = { ms: 1_500, value: `nats-${era}` };
    const created =
      era === "legacy"
        ? await c.request(
            { method: "tools/call", params: { name: "slow", arguments: args, task: {} } },
            CreateTask,
          )
        : await modernTaskCall(KEYS.acme, args);
    const { taskId } = created.task;
    await server.restart();
    await expect
      .poll(
        async () =>
          (
            await c
              .request({ method: "tasks/get", params: { taskId } }, TaskShape)
              .catch(() => ({ status: "unreachable" }))
          ).status,
        { timeout: 45_000, interval: 250 },
      )
      .toBe("completed");
  }, 60_000);
});
