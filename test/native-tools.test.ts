import { mkdtemp, rm, writeFile } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { stringify as toYaml } from "yaml";
import { callOnce, startHttpApi } from "./helpers/http-api.js";
import type { HttpApi } from "./helpers/http-api.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { freePort } from "@toolmesh/nats-launcher";

// Native HTTP tools end to end: YAML files in a folder, an executor process loading them with
// a secret from its environment, and a real HTTP server (this test's) behind them.

const SECRET = "native-secret-3b9f0c";

interface Seen {
  at: number;
  method: string;
  path: string;
  query: Record<string, string>;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

let nats: NatsServerHandle;
let api: HttpApi;
let apiUrl: string;
let closedPort: number;
let toolsDir: string;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let executor: ServiceProcess;
let env: Record<string, string>;
const seen: Seen[] = [];

/** Answers by path; `/flaky/<status>/<key>` fails once per key, then succeeds. */
function answer(req: IncomingMessage, res: ServerResponse, body: string): void {
  const url = new URL(req.url ?? "/", "http://localhost");
  const segments = url.pathname.split("/").slice(1);
  seen.push({
    at: Date.now(),
    method: req.method ?? "",
    path: url.pathname,
    query: Object.fromEntries(url.searchParams),
    headers: req.headers,
    body,
  });
  const sendJson = (status: number, value: unknown, headers: Record<string, string> = {}): void => {
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify(value));
  };
  switch (segments[0]) {
    case "orders": // echoes what arrived where
      sendJson(200, {
        path: url.pathname,
        query: Object.fromEntries(url.searchParams),
        trace: req.headers["x-trace"] ?? null,
        authorized: req.headers["x-api-key"] === SECRET,
        body: JSON.parse(body || "null") as unknown,
      });
      return;
    case "flaky": {
      const status = Number(segments[1]);
      const earlier = seen.filter((s) => s.path === url.pathname).length;
      if (earlier === 1) {
        res.writeHead(status, { "retry-after": "1", "content-type": "text/plain" });
        res.end("try again later");
      } else sendJson(200, { attempt: earlier });
      return;
    }
    case "missing":
      res.writeHead(404, { "content-type": "application/json" });
      res.end('{"error":"no such order"}');
      return;
    case "broken":
      res.writeHead(500, { "content-type": "text/plain" });
      res.end("internal trouble");
      return;
    case "text":
      res.writeHead(200, { "content-type": "text/plain; charset=utf-8" });
      res.end("plain words");
      return;
    case "json":
      sendJson(200, { temperature: 21.5, unit: "C" });
      return;
    case "leave": // a redirect out of the allowed URLs
      res.writeHead(302, { location: `http://127.0.0.1:${closedPort}/elsewhere` });
      res.end();
      return;
    default:
      res.writeHead(418);
      res.end();
  }
}

function tool(name: string, path: string, extra: Record<string, unknown> = {}): string {
  return toYaml({
    name,
    description: `The ${name} test tool.`,
    parameters: {
      type: "object",
      properties: { key: { type: "string" } },
    },
    api_url: `${apiUrl}${path}`,
    retry: { max_attempts: 3, initial_backoff_ms: 50, max_backoff_ms: 200 },
    ...extra,
  });
}

async function writeTools(dir: string, files: Record<string, string>): Promise<void> {
  await Promise.all(Object.entries(files).map(([name, text]) => writeFile(join(dir, name), text)));
}

function call(name: string, args: Record<string, unknown> = {}): Promise<ToolMessage> {
  return callOnce(client, name, args);
}

beforeAll(async () => {
  api = await startHttpApi(answer);
  apiUrl = api.url;
  closedPort = await freePort();
  toolsDir = await mkdtemp(join(tmpdir(), "toolmesh-native-"));
  await writeTools(toolsDir, {
    "orders.yaml": toYaml({
      name: "update_order",
      description: "Updates an order.",
      parameters: {
        type: "object",
        properties: {
          id: { type: "string" },
          expand: { type: "boolean" },
          trace: { type: "string" },
          quantity: { type: "integer" },
          note: { type: "string" },
        },
        required: ["id", "quantity"],
      },
      api_url: `${apiUrl}/orders/{id}`,
      method: "PATCH",
      placement: { expand: "query", trace: { header: "X-Trace" } },
      auth: { method: "api_key", env: "ORDERS_API_KEY" },
    }),
    "flaky-503.yaml": tool("flaky_503", "/flaky/503/{key}"),
    "flaky-429.yml": tool("flaky_429", "/flaky/429/{key}"),
    "missing.yaml": tool("missing", "/missing"),
    "broken.yaml": tool("broken", "/broken", {
      retry: { max_attempts: 2, initial_backoff_ms: 50 },
    }),
    "text.yaml": tool("text", "/text"),
    "json.yaml": tool("json", "/json"),
    "leave.yaml": tool("leave", "/leave", { retry: { max_attempts: 1 } }),
    "gone.yaml": toYaml({
      name: "gone",
      description: "An API nobody serves.",
      api_url: `http://127.0.0.1:${closedPort}/gone`,
      retry: { max_attempts: 2, initial_backoff_ms: 50 },
    }),
    // Same name as a builtin tool: the builtin one wins.
    "echo.yaml": tool("echo", "/json"),
  });
  nats = await startNatsServer();
  env = {
    NATS_URL: nats.url,
    TOOLMESH_NATIVE_TOOLS_DIR: toolsDir,
    TOOLMESH_NATIVE_ALLOWED_URLS: `${apiUrl}/,http://127.0.0.1:${closedPort}/gone`,
    // The test's APIs run on loopback, which tools may not reach unless allowed.
    TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "127.0.0.1",
  };
  resolver = await startService("resolver", env);
  executor = await startService("executor", { ...env, ORDERS_API_KEY: SECRET });
  const names = ["update_order", "flaky_503", "flaky_429", "missing", "broken", "text", "json"];
  await toolAvailable(resolver, ...[...names, "leave", "gone"]);
  nc = await connect({ servers: nats.url });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 20_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await nats?.stop();
  await api?.close();
  if (toolsDir !== undefined) await rm(toolsDir, { recursive: true, force: true });
});

describe("native HTTP tools", () => {
  it("places path, query, header and body params and sends the credential from the environment", async () => {
    const message = await call("update_order", {
      id: "A 7/1",
      expand: true,
      trace: "t-42",
      quantity: 3,
      note: "leave at the door",
    });
    expect(message.error).toBeUndefined();
    expect(JSON.parse(message.content)).toEqual({
      path: "/orders/A%207%2F1",
      query: { expand: "true" },
      trace: "t-42",
      authorized: true,
      body: { quantity: 3, note: "leave at the door" },
    });
    const request = seen.find((s) => s.path === "/orders/A%207%2F1");
    expect(request?.method).toBe("PATCH");
    expect(request?.headers["content-type"]).toBe("application/json");
    expect(request?.headers["idempotency-key"]).toMatch(/\/.+/);
  });

  it("keeps the secret out of every log line and the registry entry", async () => {
    await call("update_order", { id: "B1", quantity: 1 });
    const lines = [...executor.lines, ...resolver.lines].map((l) => JSON.stringify(l));
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.filter((l) => l.includes(SECRET))).toEqual([]);
    expect(executor.stderr()).not.toContain(SECRET);
    const started = executor.lines.find((l) => l.msg === "executor started");
    expect(started?.tools).toEqual(expect.arrayContaining(["update_order", "echo"]));
    const reply = await client.resolve("s-registry", {
      name: "update_order",
      arguments: { id: "x", quantity: 1 },
    });
    expect(JSON.stringify(reply)).not.toContain(SECRET);
  });

  it("keeps the builtin tool when a native tool repeats its name", async () => {
    const warning = await executor.waitForLog(
      (l) => l.msg === "duplicate tool name; the first one wins" && l.tool === "echo",
    );
    expect(String(warning.skipped)).toContain("echo.yaml");
    const message = await call("echo", { text: "builtin" });
    expect(message.content).toBe("builtin");
  });

  it.each([
    ["503", "flaky_503"],
    ["429", "flaky_429"],
  ])("retries after HTTP %s honouring Retry-After and succeeds on attempt 2", async (_, name) => {
    const key = `k-${name}`;
    const message = await call(name, { key });
    expect(message.error).toBeUndefined();
    expect(message.attempts).toBe(2);
    expect(JSON.parse(message.content)).toEqual({ attempt: 2 });
    const hits = seen.filter((s) => s.path.endsWith(`/${key}`));
    expect(hits).toHaveLength(2);
    // The policy's backoff is 50 ms: only Retry-After explains the wait.
    expect((hits[1]?.at ?? 0) - (hits[0]?.at ?? 0)).toBeGreaterThanOrEqual(950);
  });

  it("answers a 404 at once with a terminal tool_error holding the status and body", async () => {
    const message = await call("missing");
    expect(message.attempts).toBe(1);
    expect(message.error).toMatchObject({
      code: "tool_error",
      retryable: false,
      details: { status: 404, body: '{"error":"no such order"}' },
    });
  });

  it("gives up on a 500 that never ends after max_attempts, still retryable", async () => {
    const before = seen.filter((s) => s.path === "/broken").length;
    const message = await call("broken");
    expect(message.attempts).toBe(2);
    expect(message.error).toMatchObject({
      code: "tool_error",
      retryable: true,
      details: { status: 500, body: "internal trouble" },
    });
    expect(seen.filter((s) => s.path === "/broken").length - before).toBe(2);
  });

  it("answers unavailable when the API cannot be reached", async () => {
    const message = await call("gone");
    expect(message.attempts).toBe(2);
    expect(message.error).toMatchObject({ code: "unavailable", retryable: true });
  });

  it("returns JSON responses as JSON text and others as text", async () => {
    const [json, text] = await Promise.all([call("json"), call("text")]);
    expect(json.error).toBeUndefined();
    expect(JSON.parse(json.content)).toEqual({ temperature: 21.5, unit: "C" });
    expect(text.content).toBe("plain words");
  });

  it("refuses a request that leaves the allowed URLs at call time", async () => {
    const message = await call("leave");
    expect(message.error).toMatchObject({ code: "permission_denied", retryable: false });
  });

  it("refuses at start a tool whose api_url is outside the allowed URLs", async () => {
    const dir = await mkdtemp(join(tmpdir(), "toolmesh-native-refused-"));
    try {
      await writeTools(dir, { "outside.yaml": tool("outside", "/outside") });
      await expect(
        startService("executor", {
          ...env,
          TOOLMESH_NATIVE_TOOLS_DIR: dir,
          TOOLMESH_NATIVE_ALLOWED_URLS: `${apiUrl}/inside/`,
          TOOLMESH_EXECUTOR_OWNER: "refused",
        }),
      ).rejects.toThrow(/outside\.yaml: api_url .* is outside TOOLMESH_NATIVE_ALLOWED_URLS/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses at start a tool whose auth variable is not set, naming it", async () => {
    await expect(
      startService("executor", { ...env, TOOLMESH_EXECUTOR_OWNER: "no-secret" }),
    ).rejects.toThrow(/orders\.yaml: auth needs the environment variable ORDERS_API_KEY/);
  });
});
