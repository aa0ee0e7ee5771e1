import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { z } from "zod";
import type { Client } from "@modelcontextprotocol/client";
import type { CallToolResult, Tool } from "@modelcontextprotocol/client";
import { META_IDEMPOTENCY_KEY, META_TIMEOUT_MS } from "@toolmesh/gateway";
import { createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { createLogger } from "@toolmesh/telemetry";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  mcpClient,
  startGateway,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// MCP clients (the TypeScript SDK's) → the gateway → resolver → executor, all real processes.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

const silentLog = createLogger({ service: "test", level: "silent" });
let server: NatsServerHandle;
let env: Record<string, string>;
let gatewayEnv: Record<string, string>;
let gateway: { process: ServiceProcess; url: string; port: number };
let resolver: ServiceProcess;
let nc: NatsConnection;
const clients: Client[] = [];

async function client(key: string | undefined, path = ""): Promise<Client> {
  const c = await mcpClient(`${gateway.url}${path}`, key);
  clients.push(c);
  return c;
}

const text = (result: unknown): string =>
  ((result as CallToolResult).content[0] as { text: string }).text;

beforeAll(async () => {
  server = await startNatsServer();
  const [tools, configs, keys] = await Promise.all([
    gatewayTools(),
    gatewayAgents(),
    writeKeysFile(),
  ]);
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  gatewayEnv = { ...env, ...keys.env, TOOLMESH_GATEWAY_KEYS_FILE: keys.file };
  [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("schema-expander", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo", "slow", "ledger", "strict", "optimize_structure", "tally");
  gateway = await startGateway({ ...gatewayEnv, TOOLMESH_LOG_LEVEL: "debug" });
  nc = await connect({ servers: server.url });
}, 150_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("authentication", () => {
  const initialize = {
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: {
      protocolVersion: "2025-06-18",
      capabilities: {},
      clientInfo: { name: "raw", version: "1" },
    },
  };
  const post = (headers: Record<string, string>, body: unknown = initialize) =>
    fetch(gateway.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        ...headers,
      },
      body: JSON.stringify(body),
    });

  it("answers 401 with WWW-Authenticate to a request with no key", async () => {
    const res = await post({});
    expect(res.status).toBe(401);
    expect(res.headers.get("www-authenticate")).toMatch(/^Bearer realm="toolmesh"/);
  });

  it("answers 401 invalid_token to a wrong key, and the MCP client fails to connect", async () => {
    const res = await post({ authorization: "Bearer not-a-key" });
    expect(res.status).toBe(401);
    expect(res.headers.get("www-authenticate")).toContain('error="invalid_token"');
    await expect(mcpClient(gateway.url, "not-a-key")).rejects.toThrow();
  });

  it("refuses a request from a browser origin it does not know (DNS rebinding)", async () => {
    const res = await post({
      authorization: `Bearer ${KEYS.acme}`,
      origin: "http://evil.example",
    });
    expect(res.status).toBe(403);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
  });

  it("refuses a body over the size limit with 413", async () => {
    const res = await post(
      { authorization: `Bearer ${KEYS.acme}` },
      { ...initialize, params: { ...initialize.params, padding: "x".repeat(1_100_000) } },
    );
    expect(res.status).toBe(413);
    // Sent in chunks, with no Content-Length to refuse it by.
    const big = new TextEncoder().encode("x".repeat(64 * 1024));
    let sent = 0;
    const chunked = await fetch(gateway.url, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEYS.acme}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
      },
      body: new ReadableStream({
        pull(controller) {
          if ((sent += big.length) > 1_200_000) controller.close();
          else controller.enqueue(big);
        },
      }),
      duplex: "half",
    });
    expect(chunked.status).toBe(413);
  });

  it("answers what the Streamable HTTP transport refuses with its status and a JSON-RPC error", async () => {
    const auth = { authorization: `Bearer ${KEYS.acme}` };
    const message = async (res: Response) =>
      ((await res.json()) as { error: { message: string } }).error.message;
    const list = { jsonrpc: "2.0", id: 7, method: "tools/list" };
    const [accept, type, envelope, version, notification, batch, initialized] = await Promise.all([
      post({ ...auth, accept: "application/json" }, list),
      post({ ...auth, "content-type": "text/plain" }, list),
      post(auth, { jsonrpc: "1.0", id: 1, method: "ping" }),
      post({ ...auth, "mcp-protocol-version": "1999-01-01" }, list),
      post(auth, { jsonrpc: "2.0", method: "notifications/initialized" }),
      post(auth, [
        { jsonrpc: "2.0", id: "a", method: "ping" },
        { jsonrpc: "2.0", id: "b", method: "no/such" },
      ]),
      post(auth),
    ]);
    expect(accept.status).toBe(406);
    expect(await message(accept)).toMatch(
      /must accept both application\/json and text\/event-stream/,
    );
    expect(type.status).toBe(415);
    expect(envelope.status).toBe(400);
    expect(await message(envelope)).toMatch(/Invalid JSON-RPC message/);
    expect(version.status).toBe(400);
    expect(await message(version)).toMatch(/Unsupported protocol version: 1999-01-01/);
    expect(notification.status).toBe(202);
    // A batch is answered in order, each under its own id (ids of other clients never mix in).
    expect(await batch.json()).toEqual([
      { jsonrpc: "2.0", id: "a", result: {} },
      { jsonrpc: "2.0", id: "b", error: { code: -32601, message: "Method not found" } },
    ]);
    expect(initialized.status).toBe(200);
    expect(initialized.headers.get("content-type")).toBe("application/json");
    expect(initialized.headers.get("mcp-session-id")).toMatch(/^gw-/);
    expect(await initialized.json()).toMatchObject({
      id: 1,
      result: { protocolVersion: "2025-06-18" },
    });
  });

  it("is ready at /readyz", async () => {
    const res = await fetch(`http://127.0.0.1:${gateway.port}/readyz`);
    expect(res.status).toBe(200);
  });

  it("tells clients to drop an idle connection well before it does (it keeps one 65 s)", async () => {
    // A client reusing a connection the server is closing gets ECONNRESET; Node's fetch keeps
    // one until the advertised timeout less 2 s, which a busy event loop can overrun.
    const res = await fetch(gateway.url, { method: "POST", body: "{}" });
    expect(res.headers.get("keep-alive")).toBe("timeout=55");
    await res.arrayBuffer();
  });

  it("refuses to start with no authentication configured, in one line", async () => {
    const child = spawn(process.execPath, [join(ROOT, "services", "gateway", "dist", "main.js")], {
      env: { PATH: process.env.PATH ?? "", NATS_URL: server.url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (c: string) => (stderr += c));
    const [code] = (await once(child, "exit")) as [number];
    expect(code).toBe(1);
    expect(stderr.trim().split("\n")).toHaveLength(1);
    expect(stderr).toMatch(/^toolmesh gateway: no authentication configured/);
  });

  it("serves one fixed tenant with no key only when told to", async () => {
    const anonymous = await startGateway({ ...env, TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "acme" });
    try {
      const c = await mcpClient(anonymous.url, undefined);
      const result = await c.callTool({ name: "echo", arguments: { text: "hi" } });
      expect(text(result)).toBe("hi");
      await c.close();
    } finally {
      await anonymous.process.stop();
    }
  });
});

describe("tools/list", () => {
  it("lists the caller's catalog with full input schemas and no system parameters", async () => {
    const c = await client(KEYS.acme);
    const { tools } = await c.listTools();
    const names = tools.map((t) => t.name).sort();
    expect(names).toEqual(["echo", "ledger", "optimize_structure", "slow", "strict", "tally"]);
    const slow = tools.find((t) => t.name === "slow") as Tool;
    expect(Object.keys(slow.inputSchema.properties ?? {})).toEqual(["ms", "value"]);
    expect(slow.inputSchema.required).toEqual(["ms"]);
    const echo = tools.find((t) => t.name === "echo") as Tool;
    expect(echo.description).toBe(
      "Returns the text it is given. Useful to check that the mesh answers.",
    );
    expect(echo.execution?.taskSupport).toBe("optional");
  });

  it("narrows to the credential's agent, and by path within it", async () => {
    const writer = await client(KEYS.acmeWriter);
    expect((await writer.listTools()).tools.map((t) => t.name).sort()).toEqual([
      "echo",
      "ledger",
      "slow",
      "strict",
      "tally",
    ]);
    const chemistByPath = await client(KEYS.acme, "/agents/chemist");
    expect((await chemistByPath.listTools()).tools.map((t) => t.name)).toEqual([
      "optimize_structure",
    ]);
    await expect(mcpClient(`${gateway.url}/agents/chemist`, KEYS.acmeWriter)).rejects.toThrow();
  });

  it("keeps two tenants apart: neither sees nor calls the other's tools or agents", async () => {
    const globex = await client(KEYS.globex);
    expect((await globex.listTools()).tools.map((t) => t.name)).toEqual(["optimize_structure"]);
    const asWriter = await fetch(`${gateway.url}/agents/writer`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${KEYS.globex}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
      },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
    });
    expect(asWriter.status).toBe(403);
    const refused = await globex.callTool({
      name: "echo",
      arguments: { text: "x" },
    });
    expect(refused.isError).toBe(true);
    expect(refused.structuredContent).toMatchObject({ code: "permission_denied" });
    const writer = await client(KEYS.acmeWriter);
    const other = await writer.callTool({
      name: "optimize_structure",
      arguments: { input_structure: "a", model_path: "m" },
    });
    expect(other.structuredContent).toMatchObject({ code: "permission_denied" });
  });

  it("tells an open stream when the tool list changes", async () => {
    const streams = () =>
      gateway.process.lines.filter((l) => l.msg === "tool-list stream opened").length;
    const before = streams();
    const c = await client(KEYS.acme);
    const changed = new Promise<void>((resolve) =>
      c.setNotificationHandler("notifications/tools/list_changed", () => resolve()),
    );
    // The client opens its GET stream after initializing; register once it is there.
    await gateway.process.waitForLog(() => streams() > before);
    const registry = await ToolRegistry.open(nc, { subjects: createSubjects(), log: silentLog });
    await registry.register({
      name: "brand_new",
      description: "A tool registered while a client listens.",
      parameters: { type: "object", properties: {} },
      summary: "A tool registered while a client listens.",
      kind: "builtin",
      owner: "gateway-test",
    });
    await changed;
    registry.close();
    const { tools } = await c.listTools();
    expect(tools.map((t) => t.name)).toContain("brand_new");
  });

  it("tells a 2026-07-28 client listening with subscriptions/listen", async () => {
    const c = await mcpClient(gateway.url, KEYS.acme, {}, "2026-07-28");
    clients.push(c);
    const changed = new Promise<void>((resolve) =>
      c.setNotificationHandler("notifications/tools/list_changed", () => resolve()),
    );
    // Resolves once the gateway acknowledged the subscription.
    const subscription = await c.listen({ toolsListChanged: true });
    const registry = await ToolRegistry.open(nc, { subjects: createSubjects(), log: silentLog });
    await registry.register({
      name: "brand_new_modern",
      description: "A tool registered while a 2026-07-28 client listens.",
      parameters: { type: "object", properties: {} },
      summary: "A tool registered while a 2026-07-28 client listens.",
      kind: "builtin",
      owner: "gateway-test",
    });
    await changed;
    registry.close();
    await subscription.close();
    const { tools } = await c.listTools();
    expect(tools.map((t) => t.name)).toContain("brand_new_modern");
  });
});

describe("tools/call", () => {
  it("calls a tool through the mesh", async () => {
    const c = await client(KEYS.acme);
    const result = await c.callTool({
      name: "echo",
      arguments: { text: "hello", upper: true },
    });
    expect(result.isError).toBeFalsy();
    expect(text(result)).toBe("HELLO");
  });

  it("answers missing arguments with what is missing and the full schema", async () => {
    const c = await client(KEYS.acme);
    const result = await c.callTool({
      name: "strict",
      arguments: { name: "n" },
    });
    expect(result.isError).toBe(true);
    const sc = result.structuredContent as {
      code: string;
      retryable: boolean;
      details: { missing_required: string[]; parameters: { properties: object } };
    };
    expect(sc.code).toBe("missing_arguments");
    expect(sc.retryable).toBe(false);
    expect(sc.details.missing_required).toEqual(["count"]);
    expect(Object.keys(sc.details.parameters.properties)).toContain("nested");
    expect(text(result)).toContain("Missing required arguments: count");
    expect(text(result)).toContain('"nested"');
  });

  it("answers a typed error as an isError result with code, message, retryable, details", async () => {
    const c = await client(KEYS.acme);
    const unknown = await c.callTool({ name: "ecko", arguments: {} });
    expect(unknown.isError).toBe(true);
    expect(unknown.structuredContent).toMatchObject({ code: "unknown_tool", retryable: false });
    expect(JSON.stringify((unknown.structuredContent as { details?: unknown }).details)).toContain(
      "echo",
    );
    const invalid = await c.callTool({
      name: "strict",
      arguments: { name: "n", count: -1 },
    });
    expect(invalid.structuredContent).toMatchObject({ code: "invalid_parameters" });
  });

  it("takes the deadline from _meta", async () => {
    const c = await client(KEYS.acme);
    const result = await c.callTool({
      name: "slow",
      arguments: { ms: 10_000 },
      _meta: { [META_TIMEOUT_MS]: 400 },
    });
    expect(result.structuredContent).toMatchObject({ code: "deadline_exceeded" });
  });

  it("runs a call once per idempotency key, whichever request carries it", async () => {
    const a = await client(KEYS.acme);
    const b = await client(KEYS.acme);
    const call = (c: Client) =>
      c.callTool({
        name: "ledger",
        arguments: { value: "once" },
        _meta: { [META_IDEMPOTENCY_KEY]: "order-17" },
      });
    const first = JSON.parse(text(await call(a))) as { count: number; key: string };
    const second = JSON.parse(text(await call(b))) as { count: number; key: string };
    expect(first.count).toBe(1);
    expect(second).toEqual(first);
  });

  it("sends progress notifications for a progress token", async () => {
    const c = await client(KEYS.acme);
    const seen: { progress: number; total?: number }[] = [];
    const result = await c.callTool(
      { name: "optimize_structure", arguments: { input_structure: "a.cif", model_path: "m" } },
      { onprogress: (p) => seen.push(p) },
    );
    expect(result.isError).toBeFalsy();
    expect(seen.length).toBe(5);
    expect(seen.map((p) => p.progress)).toEqual([1, 2, 3, 4, 5]);
    expect(seen[0]?.total).toBe(5);
  });

  it("cancels the mesh call on notifications/cancelled", async () => {
    const c = await client(KEYS.acme);
    const abort = new AbortController();
    const started = new Promise<void>((resolve) => {
      void c
        .callTool(
          { name: "slow", arguments: { ms: 30_000, value: "to-cancel" } },
          {
            signal: abort.signal,
            onprogress: () => resolve(),
          },
        )
        .catch(() => undefined);
    });
    await started; // the tool runs (it emitted its first progress event)
    abort.abort("the user changed their mind");
    const kv = await new Kvm(nc).open(createSubjects().callsBucket);
    const until = Date.now() + 10_000;
    for (;;) {
      let cancelled = false;
      for await (const key of await kv.keys("acme.>")) {
        const entry = await kv.get(key);
        const record = entry?.json<{ tool: string; result?: { error?: { code: string } } }>();
        if (record?.tool === "slow" && record.result?.error?.code === "cancelled") cancelled = true;
      }
      if (cancelled) break;
      if (Date.now() > until) throw new Error("the slow call was not cancelled in the mesh");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  });

  it("cancels a call sent with its own idempotency key on the replica serving it", async () => {
    const c = await client(KEYS.acme);
    const abort = new AbortController();
    const key = `cancel-me-${Date.now()}`;
    const started = new Promise<void>((resolve) => {
      void c
        .callTool(
          {
            name: "slow",
            arguments: { ms: 30_000, value: "keyed" },
            _meta: { [META_IDEMPOTENCY_KEY]: key },
          },
          { signal: abort.signal, onprogress: () => resolve() },
        )
        .catch(() => undefined);
    });
    await started;
    abort.abort("stop");
    // The same key asks again: the answer is the call's final message, `cancelled`.
    const again = await c.callTool({
      name: "slow",
      arguments: { ms: 30_000, value: "keyed" },
      _meta: { [META_IDEMPOTENCY_KEY]: key },
    });
    expect(again.structuredContent).toMatchObject({ code: "cancelled" });
  });

  it("pages a catalog longer than one page", async () => {
    const registry = await ToolRegistry.open(nc, { subjects: createSubjects(), log: silentLog });
    await Promise.all(
      Array.from({ length: 70 }, (_, i) =>
        registry.register({
          name: `bulk_${String(i).padStart(2, "0")}`,
          description: `Bulk tool ${i}.`,
          summary: `Bulk tool ${i}.`,
          kind: "builtin",
          parameters: { type: "object", properties: {} },
          owner: "gateway-test",
        }),
      ),
    );
    registry.close();
    const c = await client(KEYS.acme);
    // Without a cursor the v2 client walks every page itself: ask for the first page alone.
    const first = await c.request(
      { method: "tools/list", params: {} },
      z
        .object({
          tools: z.array(z.object({ name: z.string() }).loose()),
          nextCursor: z.string().optional(),
        })
        .loose(),
    );
    expect(first.tools).toHaveLength(64);
    expect(first.nextCursor).toBeDefined();
    const second = await c.listTools({ cursor: first.nextCursor });
    const all = [...first.tools, ...second.tools].map((t) => t.name);
    expect(all.filter((n) => n.startsWith("bulk_"))).toHaveLength(70);
    expect(new Set(all).size).toBe(all.length);
    const aggregated = (await c.listTools()).tools.map((t) => t.name);
    expect(aggregated.filter((n) => n.startsWith("bulk_"))).toHaveLength(70);
    await expect(c.listTools({ cursor: "bogus" })).rejects.toThrow(/cursor/);
  });
});
