import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadNativeToolsDir } from "@toolmesh/executor/internal";
import type { PrivateAddressAllowance, ToolContext } from "@toolmesh/tool-host";
import { outboundFetch, privateAddressCause, trustedHostsOf } from "@toolmesh/tool-host";
import { McpServerConfigSchema } from "@toolmesh/mcp-bridge";
import { ServerConnection } from "@toolmesh/mcp-bridge/internal";
import { ToolmeshError } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";

// Outbound HTTP of native tools and HTTP/SSE MCP servers refuses private addresses — given
// directly, reached through a redirect, or behind a DNS name — unless allowed, except the exact
// host the operator configured (trusted unless `trust_configured_host: false` or
// TOOLMESH_TRUST_CONFIGURED_HOSTS=false). Real HTTP servers on loopback addresses stand in for
// internal services: 127.0.0.2 plays the public host that is allowed, 127.0.0.1 the internal one.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const log = createLogger({ service: "test", level: "silent" });

let internal: Server;
let front: Server;
let internalPort: number;
let frontPort: number;
let dir: string;
let mcp: ChildProcess;
let mcpUrl: URL;

async function listen(server: Server, host: string): Promise<number> {
  server.listen(0, host);
  await once(server, "listening");
  return (server.address() as AddressInfo).port;
}

beforeAll(async () => {
  internal = createServer((req, res) => {
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ secret: "internal data", path: req.url }));
  });
  internalPort = await listen(internal, "127.0.0.1");
  // Redirects every request to the internal server, keeping the path.
  front = createServer((req, res) => {
    const to = req.url?.startsWith("/mcp")
      ? `${mcpUrl.origin}${req.url}`
      : `http://127.0.0.1:${internalPort}${req.url ?? "/"}`;
    res.writeHead(307, { location: to });
    res.end();
  });
  frontPort = await listen(front, "127.0.0.2");
  dir = await mkdtemp(join(tmpdir(), "toolmesh-outbound-"));
  mcp = spawn(
    process.execPath,
    [join(ROOT, "test", "fixtures", "mcp", "test-server.mjs"), "--http"],
    {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? "", MCP_TEST_RECORD: join(dir, "records.jsonl") },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const lines = createInterface({ input: mcp.stdout! });
  const [line] = (await once(lines, "line")) as [string];
  lines.close();
  mcpUrl = new URL((JSON.parse(line) as { listening: string }).listening);
});

afterAll(async () => {
  internal?.close();
  front?.close();
  mcp?.kill();
  await rm(dir, { recursive: true, force: true });
});

function ctx(): ToolContext {
  return {
    callId: "c1",
    idempotencyKey: "s1/c1",
    sessionId: "s1",
    tool: "fetcher",
    attempt: 1,
    context: {},
    signal: new AbortController().signal,
    deadlineAt: Date.now() + 60_000,
    emit: () => undefined,
    log,
  };
}

/**
 * Calls a native tool whose `api_url` is `url`; resolves with the result or the error. `trust`
 * is the file's `trust_configured_host` (false unless given, so the guard is what is tested),
 * `trustDefault` the process-wide TOOLMESH_TRUST_CONFIGURED_HOSTS.
 */
async function callNative(
  url: string,
  allow?: PrivateAddressAllowance,
  trust: boolean | null = false,
  trustDefault?: boolean,
): Promise<unknown> {
  const tools = join(dir, `t-${Math.random().toString(36).slice(2)}`);
  await rm(tools, { recursive: true, force: true });
  await (await import("node:fs/promises")).mkdir(tools);
  await writeFile(
    join(tools, "fetcher.yaml"),
    `name: fetcher\ndescription: Fetches a page.\napi_url: ${url}\n` +
      (trust === null ? "" : `trust_configured_host: ${trust}\n`),
  );
  const [tool] = await loadNativeToolsDir(tools, {}, log, {
    ...(allow === undefined ? {} : { allowPrivateAddresses: allow }),
    ...(trustDefault === undefined ? {} : { trustConfiguredHosts: trustDefault }),
  });
  return Promise.resolve(tool!.handler({}, ctx())).catch((err: unknown) => err);
}

function expectDenied(outcome: unknown, address: string, range: string): void {
  expect(outcome).toBeInstanceOf(ToolmeshError);
  const err = outcome as ToolmeshError;
  expect(err.code).toBe("permission_denied");
  expect(err.retryable).toBe(false);
  expect(err.details).toMatchObject({ address, range, reason: "private_address" });
  expect(err.message).toContain("TOOLMESH_ALLOW_PRIVATE_ADDRESSES");
}

describe("native tools", () => {
  it("refuse a private address given directly, and reach it when allowed", async () => {
    expectDenied(await callNative(`http://127.0.0.1:${internalPort}/a`), "127.0.0.1", "loopback");
    expectDenied(
      await callNative("http://169.254.169.254/latest/meta-data"),
      "169.254.169.254",
      "link-local",
    );
    expectDenied(await callNative("http://[::ffff:10.1.2.3]/x"), "::ffff:a01:203", "private");
    expect(await callNative(`http://127.0.0.1:${internalPort}/a`, true)).toEqual({
      secret: "internal data",
      path: "/a",
    });
    expect(await callNative(`http://127.0.0.1:${internalPort}/b`, ["127.0.0.0/8"])).toMatchObject({
      path: "/b",
    });
  });

  it("refuse a DNS name that resolves to a private address", async () => {
    const outcome = await callNative(`http://localhost:${internalPort}/a`);
    expect(outcome).toBeInstanceOf(ToolmeshError);
    expect((outcome as ToolmeshError).code).toBe("permission_denied");
    expect((outcome as ToolmeshError).message).toMatch(
      /localhost \((127\.0\.0\.1|::1)\) is a loopback address/,
    );
    expect(await callNative(`http://localhost:${internalPort}/a`, true)).toMatchObject({
      path: "/a",
    });
  });

  it("refuse a redirect from an allowed host to a private one", async () => {
    expectDenied(
      await callNative(`http://127.0.0.2:${frontPort}/r`, ["127.0.0.2"]),
      "127.0.0.1",
      "loopback",
    );
    expect(await callNative(`http://127.0.0.2:${frontPort}/r`, ["127.0.0.0/8"])).toMatchObject({
      path: "/r",
    });
  });

  it("trust the exact host the operator configured, by default, and only that host", async () => {
    // Configured at a loopback address: trusted without any allowance.
    expect(await callNative(`http://127.0.0.1:${internalPort}/a`, undefined, null)).toEqual({
      secret: "internal data",
      path: "/a",
    });
    expect(await callNative(`http://localhost:${internalPort}/b`, undefined, null)).toMatchObject({
      path: "/b",
    });
    // The configured host redirects elsewhere: the other host is guarded as ever.
    expectDenied(
      await callNative(`http://127.0.0.2:${frontPort}/r`, [], null),
      "127.0.0.1",
      "loopback",
    );
    // The process-wide default off, and the per-tool override either way.
    expectDenied(
      await callNative(`http://127.0.0.1:${internalPort}/a`, undefined, null, false),
      "127.0.0.1",
      "loopback",
    );
    expect(
      await callNative(`http://127.0.0.1:${internalPort}/a`, undefined, true, false),
    ).toMatchObject({ path: "/a" });
    expectDenied(
      await callNative(`http://127.0.0.1:${internalPort}/a`, undefined, false, true),
      "127.0.0.1",
      "loopback",
    );
  });

  it("trust a host and port exactly: another port of the same host is guarded", () => {
    expect(trustedHostsOf("http://10.0.0.7/mcp", undefined)).toEqual(["10.0.0.7:80"]);
    expect(trustedHostsOf("https://API.internal:8443/x", undefined)).toEqual(["api.internal:8443"]);
    expect(trustedHostsOf("http://[::1]:3000/", true, false)).toEqual(["::1:3000"]);
    expect(trustedHostsOf("http://10.0.0.7/", false)).toEqual([]);
    expect(trustedHostsOf("http://10.0.0.7/", undefined, false)).toEqual([]);
  });

  it("a trusted host on another port is refused", async () => {
    const fetch = outboundFetch([], trustedHostsOf(`http://127.0.0.1:${frontPort}/`, true));
    const outcome = await fetch(`http://127.0.0.1:${internalPort}/a`).catch((e: unknown) => e);
    expect(privateAddressCause(outcome)?.address).toBe("127.0.0.1");
  });

  it("a bad allowance is refused with what is wrong", () => {
    expect(() => outboundFetch(["10.0.0.0/33"])).toThrow(
      "10.0.0.0/33 is not an IP address or CIDR range",
    );
  });
});

describe("HTTP MCP servers", () => {
  /** Connects as the bridge does: the server's own `url` host trusted unless `trust` is false. */
  async function connectTo(
    url: string,
    allow: PrivateAddressAllowance,
    trust = false,
  ): Promise<ServerConnection> {
    const config = McpServerConfigSchema.parse({
      name: "remote",
      transport: "http",
      url,
      connect_timeout_ms: 5_000,
      reconnect: { initial_delay_ms: 60_000, max_delay_ms: 60_000 },
      trust_configured_host: trust,
    });
    if (config.transport === "stdio") throw new Error("unreachable");
    const connection = new ServerConnection({
      config,
      env: {},
      log,
      fetch: outboundFetch(allow, trustedHostsOf(config.url, config.trust_configured_host)),
      onTools: async () => undefined,
    });
    await connection.start();
    return connection;
  }

  it("refuse a private address, directly, by DNS name or by redirect, and connect when allowed", async () => {
    const direct = await connectTo(mcpUrl.href, []);
    expect(direct.state).not.toBe("ready");
    expect(direct.lastError).toMatch(/127\.0\.0\.1 is a loopback address/);
    await direct.stop();
    const named = await connectTo(mcpUrl.href.replace("127.0.0.1", "localhost"), []);
    expect(named.state).not.toBe("ready");
    expect(named.lastError).toMatch(/localhost \((127\.0\.0\.1|::1)\) is a loopback address/);
    await named.stop();
    // The MCP SDK itself follows no redirect to another origin; the guard would refuse it too.
    const redirected = await connectTo(`http://127.0.0.2:${frontPort}${mcpUrl.pathname}`, [
      "127.0.0.2",
    ]);
    expect(redirected.state).not.toBe("ready");
    expect(redirected.lastError).toMatch(/127\.0\.0\.1/);
    await redirected.stop();
    const allowed = await connectTo(mcpUrl.href, ["127.0.0.1"]);
    expect(allowed.state).toBe("ready");
    await allowed.stop();
  });

  it("trust the server's configured host, and still refuse a redirect to another", async () => {
    const trusted = await connectTo(mcpUrl.href, [], true);
    expect(trusted.state).toBe("ready");
    await trusted.stop();
    const redirected = await connectTo(`http://127.0.0.2:${frontPort}${mcpUrl.pathname}`, [], true);
    expect(redirected.state).not.toBe("ready");
    expect(redirected.lastError).toMatch(/127\.0\.0\.1/);
    await redirected.stop();
  });
});
