import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile, spawnSync } from "node:child_process";
import { mkdir, mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import type { Client } from "@modelcontextprotocol/client";
import { createSubjects } from "@toolmesh/protocol";
import type { CallToolResult, Tool } from "@modelcontextprotocol/client";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  mcpClient,
  startGateway,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { writeStdioTestServer } from "./helpers/mcp-test-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startOtlpReceiver } from "./helpers/otlp-receiver.js";
import type { OtlpReceiver } from "./helpers/otlp-receiver.js";

// Clients people use — the Python MCP SDK, the MCP Inspector's CLI, the TypeScript SDK — against
// the gateway in front of the real mesh, including a tool of an MCP server behind the MCP bridge
// (MCP in → mesh → MCP out); and the gateway's edges: limits, metrics, traces.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const PYTHON_CLIENT = join(ROOT, "test", "fixtures", "gateway", "python-client.py");
const INSPECTOR = join(
  ROOT,
  "node_modules",
  "@modelcontextprotocol",
  "inspector-cli",
  "build",
  "index.js",
);
const run = promisify(execFile);

const python = spawnSync("python3", ["-c", "import mcp.client.streamable_http"], {
  encoding: "utf8",
});
const havePythonMcp = python.status === 0;
if (!havePythonMcp) {
  console.warn(
    "\n!!! SKIPPING the Python MCP client tests: python3 with the `mcp` package is missing " +
      "(pip install mcp). CI must install it.\n",
  );
}

let server: NatsServerHandle;
let receiver: OtlpReceiver;
let env: Record<string, string>;
let gatewayEnv: Record<string, string>;
let gateway: { process: ServiceProcess; url: string; port: number };
const clients: Client[] = [];

async function client(key: string = KEYS.acme, headers: Record<string, string> = {}) {
  const c = await mcpClient(gateway.url, key, headers);
  clients.push(c);
  return c;
}

const text = (result: unknown): string =>
  ((result as CallToolResult).content[0] as { text: string }).text;

beforeAll(async () => {
  [server, receiver] = await Promise.all([startNatsServer(), startOtlpReceiver()]);
  const [tools, configs, keys] = await Promise.all([
    gatewayTools(),
    gatewayAgents(),
    writeKeysFile(),
  ]);
  const mcpDir = await mkdtemp(join(tmpdir(), "toolmesh-gateway-mcp-"));
  await mkdir(mcpDir, { recursive: true });
  await writeStdioTestServer(mcpDir, "t", { MCP_TEST_NAME: "t" });
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_MCP_DIR: mcpDir,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${receiver.url}/v1/traces`,
    OTEL_BSP_SCHEDULE_DELAY: "50",
  };
  gatewayEnv = { ...env, ...keys.env, TOOLMESH_GATEWAY_KEYS_FILE: keys.file };
  const [resolver] = await Promise.all([
    // Generous start-up waits: four processes start at once on a shared machine.
    startService("resolver", { ...env, OTEL_SERVICE_NAME: "gw-resolver" }, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
    startService("mcp-bridge", env, 60_000),
  ]);
  for (const tool of ["echo", "strict", "optimize_structure", "t.echo", "t.count"])
    await toolAvailable(resolver, tool);
  gateway = await startGateway({
    ...gatewayEnv,
    OTEL_SERVICE_NAME: "gw-gateway",
    TOOLMESH_METRICS_PORT: "0",
  });
}, 180_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await killAllServices();
  await receiver?.close();
  await server?.stop();
});

/** Waits until the mesh holds a cancelled call of `tool` for tenant acme. */
async function cancelledInMesh(tool: string): Promise<void> {
  const nc = await connect({ servers: server.url });
  try {
    const kv = await new Kvm(nc).open(createSubjects().callsBucket);
    for (const until = Date.now() + 10_000; Date.now() < until;) {
      for await (const key of await kv.keys("acme.>")) {
        const record = (await kv.get(key))?.json<{
          tool: string;
          result?: { error?: { code: string } };
        }>();
        if (record?.tool === tool && record.result?.error?.code === "cancelled") return;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error(`no cancelled ${tool} call in the mesh`);
  } finally {
    await nc.close();
  }
}

describe("the Python MCP SDK client", () => {
  it.skipIf(!havePythonMcp)("lists, calls, gets typed errors and progress, cancels", async () => {
    const { stdout } = await run("python3", [PYTHON_CLIENT, gateway.url, KEYS.acme], {
      timeout: 60_000,
    });
    const out = JSON.parse(stdout) as {
      tools: string[];
      schemas: Record<string, { properties?: Record<string, unknown> }>;
      echo: { isError: boolean; text: string };
      missing: { isError: boolean; structured: { code: string; details: object } };
      unknown: { isError: boolean; structured: { code: string } };
      optimize: { isError: boolean; progress: { progress: number; total: number }[] };
      cancelled: boolean;
    };
    expect(out.tools).toEqual(expect.arrayContaining(["echo", "strict", "t.echo"]));
    expect(Object.keys(out.schemas.slow?.properties ?? {})).toEqual(["ms", "value"]);
    expect(out.echo).toEqual({ isError: false, text: "from python" });
    expect(out.missing.isError).toBe(true);
    expect(out.missing.structured.code).toBe("missing_arguments");
    expect(out.missing.structured.details).toMatchObject({ missing_required: ["count"] });
    expect(out.unknown.structured.code).toBe("unknown_tool");
    expect(out.optimize.isError).toBe(false);
    expect(out.optimize.progress.map((p) => p.progress)).toEqual([1, 2, 3, 4, 5]);
    expect(out.cancelled).toBe(true);
    await cancelledInMesh("slow"); // the abandoned call's notifications/cancelled reached the mesh
  });

  it.skipIf(!havePythonMcp)("is refused without a valid key", async () => {
    await expect(
      run("python3", [PYTHON_CLIENT, gateway.url, "wrong-key"], { timeout: 60_000 }),
    ).rejects.toThrow(/unknown key/);
  });
});

describe("the MCP Inspector CLI", () => {
  const inspect = (args: string[]) =>
    run(
      process.execPath,
      [
        INSPECTOR,
        gateway.url,
        "--transport",
        "http",
        "--header",
        `Authorization: Bearer ${KEYS.acmeWriter}`,
        ...args,
      ],
      // It reads its own package.json relative to the working directory.
      { timeout: 60_000, cwd: dirname(INSPECTOR) },
    );

  it("lists the tools of its credential's agent", async () => {
    const { stdout } = await inspect(["--method", "tools/list"]);
    const listed = JSON.parse(stdout) as { tools: Tool[] };
    expect(listed.tools.map((t) => t.name).sort()).toEqual([
      "echo",
      "ledger",
      "slow",
      "strict",
      "tally",
    ]);
  });

  it("calls a tool", async () => {
    const { stdout } = await inspect([
      "--method",
      "tools/call",
      "--tool-name",
      "echo",
      "--tool-arg",
      "text=inspected",
    ]);
    expect(text(JSON.parse(stdout))).toBe("inspected");
  });

  it("gets missing arguments and a typed error as isError results", async () => {
    const call = async (tool: string, args: string[]) => {
      const { stdout } = await inspect(["--method", "tools/call", "--tool-name", tool, ...args]);
      return JSON.parse(stdout) as CallToolResult;
    };
    const [missing, unknown] = await Promise.all([
      call("strict", ["--tool-arg", "name=n"]),
      call("ecko", []),
    ]);
    expect(missing.isError).toBe(true);
    expect(missing.structuredContent).toMatchObject({
      code: "missing_arguments",
      details: { missing_required: ["count"] },
    });
    expect(text(missing)).toMatch(/Missing required arguments: count/);
    expect(unknown.isError).toBe(true);
    expect(unknown.structuredContent).toMatchObject({ code: "unknown_tool" });
  });
});

describe("a bridged MCP server's tool through the gateway", () => {
  it("lists it with its annotations and calls it: MCP in, mesh, MCP out", async () => {
    const c = await client();
    const { tools } = await c.listTools();
    const echo = tools.find((t) => t.name === "t.echo");
    expect(echo?.annotations).toEqual({ readOnlyHint: true });
    expect(echo?.inputSchema.required).toEqual(["text"]);
    const result = await c.callTool({ name: "t.echo", arguments: { text: "round trip" } });
    expect(text(result)).toBe("round trip");
    const progress: number[] = [];
    const counted = await c.callTool(
      { name: "t.count", arguments: { steps: 3 } },
      {
        onprogress: (p) => progress.push(p.progress),
      },
    );
    expect(text(counted)).toBe("counted to 3");
    expect(progress).toEqual([1, 2, 3]);
  });
});

describe("edges", () => {
  it("counts calls per tenant, tool and outcome in its metrics", async () => {
    const c = await client();
    await c.callTool({ name: "echo", arguments: { text: "m" } });
    await c.callTool({ name: "echo", arguments: {} });
    const port = (await gateway.process.waitForLog((l) => l.msg === "metrics served at /metrics"))
      .port as number;
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    const sample = (outcome: string) =>
      metrics
        .split("\n")
        .find(
          (line) =>
            line.startsWith("toolmesh_gateway_calls_total{") &&
            line.includes(`outcome="${outcome}"`) &&
            line.includes('toolmesh_tenant="acme"') &&
            line.includes('toolmesh_tool="echo"'),
        )
        ?.split(" ")
        .at(-1);
    expect(metrics).toContain("toolmesh_gateway_calls_total");
    expect(Number(sample("ok"))).toBeGreaterThanOrEqual(1);
    expect(Number(sample("missing_arguments"))).toBeGreaterThanOrEqual(1);
  });

  it("roots the call's trace in its span, under the caller's traceparent", async () => {
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    const parent = "00f067aa0ba902b7";
    const c = await client(KEYS.acme, { traceparent: `00-${traceId}-${parent}-01` });
    await c.callTool({ name: "echo", arguments: { text: "traced" } });
    // Each process exports its spans in its own batches: wait for the gateway's and the
    // resolver's.
    const spans = await receiver.waitFor(
      (all) =>
        all.some((s) => s.traceId === traceId && s.service === "gw-resolver") &&
        all.some((s) => s.traceId === traceId && s.service === "gw-gateway" && s.kind === 2),
    );
    const mine = spans.filter((s) => s.traceId === traceId);
    const gatewaySpans = mine.filter((s) => s.service === "gw-gateway" && s.kind === 2);
    expect(gatewaySpans.length).toBeGreaterThan(0);
    expect(gatewaySpans.every((s) => s.parentSpanId === parent)).toBe(true);
    expect(mine.some((s) => s.service === "gw-resolver")).toBe(true);
  });

  it("limits one credential's rate and requests in flight, answering 429 with Retry-After", async () => {
    const limited = await startGateway({
      ...gatewayEnv,
      TOOLMESH_GATEWAY_RATE_PER_S: "0.1",
      TOOLMESH_GATEWAY_RATE_BURST: "6",
      TOOLMESH_GATEWAY_MAX_CONCURRENT: "1",
    });
    try {
      const ping = (key: string) =>
        fetch(limited.url, {
          method: "POST",
          headers: {
            authorization: `Bearer ${key}`,
            "content-type": "application/json",
            accept: "application/json, text/event-stream",
          },
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" }),
        });
      // Connecting costs three requests (initialize, initialized, the GET stream), the call one.
      const c = await mcpClient(limited.url, KEYS.acmeWriter);
      let running!: () => void;
      const started = new Promise<void>((resolve) => (running = resolve));
      const slow = c.callTool(
        { name: "slow", arguments: { ms: 1_500 } },
        {
          onprogress: () => running(),
        },
      );
      await started;
      // One request in flight blocks a second of the same credential.
      const busy = await ping(KEYS.acmeWriter);
      expect(busy.status).toBe(429);
      expect(busy.headers.get("retry-after")).toBe("1");
      await slow;
      // What is left of the burst is spent at once, and it refills at 0.1/s.
      const statuses: number[] = [];
      let rated: Response | undefined;
      for (let i = 0; i < 4 && rated === undefined; i++) {
        const res = await ping(KEYS.acmeWriter);
        statuses.push(res.status);
        if (res.status === 429) rated = res;
      }
      expect(statuses.at(-1)).toBe(429);
      expect(Number(rated?.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      // Another credential is not affected.
      expect((await ping(KEYS.acme)).status).toBe(200);
      await c.close().catch(() => undefined);
    } finally {
      await limited.process.stop();
    }
  });
});
