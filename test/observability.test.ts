import { spawn } from "node:child_process";
import { once } from "node:events";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { sample, scrapeMetrics } from "./helpers/metrics.js";
import { writeStdioTestServer } from "./helpers/mcp-test-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startOtlpReceiver } from "./helpers/otlp-receiver.js";
import type { CollectedSpan, OtlpReceiver } from "./helpers/otlp-receiver.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const BIN = join(ROOT, "bin", "toolmesh.js");
const KIND = { internal: 1, client: 3, producer: 4, consumer: 5 } as const;

let server: NatsServerHandle;
let receiver: OtlpReceiver;
let work: string;
let records: string;
let env: Record<string, string>;
let resolver: ServiceProcess;
let executor: ServiceProcess;
let bridge: ServiceProcess;
let nc: NatsConnection;
let client: ToolmeshClient;

const portOf = async (service: ServiceProcess, msg: string): Promise<number> =>
  (await service.waitForLog((l) => l.msg === msg)).port as number;

beforeAll(async () => {
  [server, receiver] = await Promise.all([startNatsServer(), startOtlpReceiver()]);
  work = await mkdtemp(join(tmpdir(), "toolmesh-observability-"));
  records = join(work, "records.jsonl");
  await mkdir(join(work, "mcp"));
  await writeStdioTestServer(join(work, "mcp"), "t", {
    MCP_TEST_NAME: "t",
    MCP_TEST_RECORD: records,
  });
  env = {
    NATS_URL: server.url,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${receiver.url}/v1/traces`,
    OTEL_BSP_SCHEDULE_DELAY: "50",
    TOOLMESH_METRICS_PORT: "0",
  };
  resolver = await startService("resolver", { ...env, OTEL_SERVICE_NAME: "obs-resolver" });
  [executor, bridge] = await Promise.all([
    startService("executor", {
      ...env,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-a"),
      // OTEL_SERVICE_NAME wins over service.name in the resource attributes.
      OTEL_SERVICE_NAME: "obs-executor",
      OTEL_RESOURCE_ATTRIBUTES: "service.name=not-this-one,deployment.environment=test",
    }),
    startService("mcp-bridge", {
      ...env,
      TOOLMESH_MCP_DIR: join(work, "mcp"),
      TOOLMESH_HEALTH_PORT: "0",
      // Without OTEL_SERVICE_NAME, service.name from the resource attributes wins over the role.
      OTEL_RESOURCE_ATTRIBUTES: "service.name=obs-bridge",
    }),
  ]);
  await toolAvailable(resolver, "misbehave", "whoami", "t.echo", "t.count");
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await Promise.all([server?.stop(), receiver?.close()]);
  if (work !== undefined) await rm(work, { recursive: true, force: true });
});

/** `toolmesh call` as a traced frontend of its own (service obs-cli); returns the final message. */
async function cliCall(tool: string, args: unknown, extra: string[] = []): Promise<ToolMessage> {
  const outcome = await runCli(
    ["call", tool, "--args", JSON.stringify(args), "--json", "--quiet", ...extra],
    { ...env, OTEL_SERVICE_NAME: "obs-cli" },
  );
  expect(outcome.stderr).toBe("");
  return JSON.parse(outcome.stdout) as ToolMessage;
}

const sameTrace = (spans: CollectedSpan[], traceId: string) =>
  spans.filter((s) => s.traceId === traceId);

describe("one call is one trace, from the frontend to its receipt", () => {
  it("resolver → executor with a retry: send, resolve, two linked attempts, receipt", async () => {
    const message = await cliCall("misbehave", { mode: "flaky" });
    expect(message.error).toBeUndefined();
    const callId = message.tool_call_id;
    const complete = (spans: CollectedSpan[]): boolean => {
      const send = spans.find(
        (s) => s.name === "send" && s.attributes["gen_ai.tool.call.id"] === callId,
      );
      if (send === undefined) return false;
      const names = sameTrace(spans, send.traceId).map((s) => s.name);
      return (
        names.filter((n) => n === "execute_tool misbehave").length === 2 &&
        names.includes("receive misbehave") &&
        names.includes("resolve")
      );
    };
    const spans = await receiver.waitFor(complete, 15_000);
    const send = spans.find(
      (s) => s.name === "send" && s.attributes["gen_ai.tool.call.id"] === callId,
    )!;
    const trace = sameTrace(spans, send.traceId);
    const byId = new Map(trace.map((s) => [s.spanId, s]));

    expect(send).toMatchObject({
      service: "obs-cli",
      kind: KIND.producer,
      parentSpanId: undefined,
      attributes: {
        "messaging.system": "nats",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.template": "toolmesh.v1.calls.{tenant}.{session}",
        "gen_ai.tool.name": "misbehave",
      },
    });
    expect(send.attributes["messaging.message.id"]).toEqual(expect.any(String));

    const resolve = trace.find((s) => s.name === "resolve")!;
    expect(resolve).toMatchObject({
      service: "obs-resolver",
      kind: KIND.consumer,
      parentSpanId: send.spanId,
      attributes: {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "toolmesh.call_id": callId,
        "toolmesh.tool": "misbehave",
      },
    });

    const attempts = trace
      .filter((s) => s.name === "process misbehave")
      .sort(
        (a, b) =>
          Number(a.attributes["toolmesh.attempt"]) - Number(b.attributes["toolmesh.attempt"]),
      );
    expect(
      attempts.map((s) => [s.service, s.kind, s.parentSpanId, s.attributes["toolmesh.attempt"]]),
    ).toEqual([
      ["obs-executor", KIND.consumer, resolve.spanId, 1],
      ["obs-executor", KIND.consumer, resolve.spanId, 2],
    ]);
    // The retry is a new span, linked to the attempt before it.
    expect(attempts[1]!.links).toEqual([{ traceId: send.traceId, spanId: attempts[0]!.spanId }]);

    const executions = trace.filter((s) => s.name === "execute_tool misbehave");
    for (const [i, attempt] of attempts.entries()) {
      const execution = executions.find((s) => s.parentSpanId === attempt.spanId);
      expect(execution).toMatchObject({
        kind: KIND.internal,
        attributes: {
          "gen_ai.operation.name": "execute_tool",
          "gen_ai.tool.name": "misbehave",
          "gen_ai.tool.call.id": callId,
          "gen_ai.tool.type": "function",
          "toolmesh.attempt": i + 1,
        },
      });
      // Arguments and results are not recorded unless TOOLMESH_TRACE_PAYLOADS=true.
      expect(execution?.attributes["gen_ai.tool.call.arguments"]).toBeUndefined();
    }
    expect(executions.find((s) => s.parentSpanId === attempts[0]!.spanId)).toMatchObject({
      statusCode: 2,
      attributes: { "error.type": "tool_error" },
    });

    // The frontend's receipt closes the trace under the hop that published the final message.
    const receipt = trace.find((s) => s.name === "receive misbehave")!;
    expect(receipt).toMatchObject({
      service: "obs-cli",
      kind: KIND.consumer,
      parentSpanId: attempts[1]!.spanId,
      links: [{ traceId: send.traceId, spanId: send.spanId }],
    });
    expect(byId.get(receipt.parentSpanId!)?.service).toBe("obs-executor");
  });

  it("through the MCP bridge: the tools/call request carries the trace to the server in _meta", async () => {
    const bridgeHops = ["resolve", "process t.echo", "execute_tool t.echo", "tools/call echo"];
    const message = await cliCall("t.echo", { text: "traced" });
    expect(message.content).toBe("traced");
    const callId = message.tool_call_id;
    const spans = await receiver.waitFor((all) => {
      const send = all.find(
        (s) => s.name === "send" && s.attributes["gen_ai.tool.call.id"] === callId,
      );
      if (send === undefined) return false;
      // Every service exports on its own schedule: wait for each hop's span, not only the last.
      const names = new Set(sameTrace(all, send.traceId).map((s) => s.name));
      return bridgeHops.every((name) => names.has(name));
    }, 15_000);
    const send = spans.find(
      (s) => s.name === "send" && s.attributes["gen_ai.tool.call.id"] === callId,
    )!;
    const trace = sameTrace(spans, send.traceId);
    const resolve = trace.find((s) => s.name === "resolve")!;
    const processed = trace.find((s) => s.name === "process t.echo")!;
    const execution = trace.find((s) => s.name === "execute_tool t.echo")!;
    const request = trace.find((s) => s.name === "tools/call echo")!;
    expect(resolve.parentSpanId).toBe(send.spanId);
    expect(processed).toMatchObject({ service: "obs-bridge", parentSpanId: resolve.spanId });
    expect(execution).toMatchObject({
      service: "obs-bridge",
      parentSpanId: processed.spanId,
      attributes: { "gen_ai.tool.type": "extension", "gen_ai.tool.name": "t.echo" },
    });
    expect(request).toMatchObject({
      service: "obs-bridge",
      kind: KIND.client,
      parentSpanId: execution.spanId,
      attributes: { "mcp.method.name": "tools/call", "toolmesh.mcp.server": "t" },
    });
    const traced = (await readFile(records, "utf8"))
      .split("\n")
      .filter((line) => line !== "")
      .map((line) => JSON.parse(line) as { event: string; traceparent?: string })
      .filter((r) => r.event === "traced-call");
    expect(traced.map((r) => r.traceparent)).toContain(`00-${send.traceId}-${request.spanId}-01`);
  });

  it("a broken or hanging exporter does not fail or hold up the call", async () => {
    const hanging: Server = createServer(() => undefined); // accepts, never answers
    hanging.listen(0, "127.0.0.1");
    await once(hanging, "listening");
    try {
      for (const endpoint of [
        `http://127.0.0.1:${(hanging.address() as AddressInfo).port}/v1/traces`,
        "http://127.0.0.1:1/v1/traces", // refused
      ]) {
        const outcome = await runCli(["call", "whoami", "--json", "--quiet"], {
          NATS_URL: server.url,
          OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: endpoint,
        });
        expect(outcome.code).toBe(0);
        expect((JSON.parse(outcome.stdout) as ToolMessage).error).toBeUndefined();
      }
    } finally {
      hanging.closeAllConnections();
      hanging.close();
    }
  });
});

describe("metrics after known traffic", () => {
  it("count calls, attempts, retries, timeouts and rejections per tool and error type, and toolmesh stats shows the same", async () => {
    // Known traffic on top of the two calls traced above (misbehave flaky: 2 attempts; t.echo)
    // and the two whoami calls of the exporter test.
    const session = client.session("obs-metrics");
    const results = await Promise.all([
      session.submit({ name: "whoami", arguments: {} }).result,
      session.submit({ name: "misbehave", arguments: { mode: "hang" } }).result, // 3 timeouts
      session.submit({ name: "misbehave", arguments: { mode: "nope" } }).result, // invalid
      session.submit({ name: "nosuch", arguments: {} }).result, // unknown tool
    ]);
    session.close();
    expect(results.map((m) => m.error?.code)).toEqual([
      undefined,
      "timeout",
      "invalid_parameters",
      "unknown_tool",
    ]);

    const [executorText, resolverText, bridgeText] = await Promise.all([
      scrapeMetrics(executor),
      scrapeMetrics(resolver),
      scrapeMetrics(bridge),
    ]);
    const calls = (tool: string, error_type: string) =>
      sample(executorText, "toolmesh_tool_calls_total", { gen_ai_tool_name: tool, error_type });
    expect(calls("whoami", "")).toBe(3);
    expect(calls("misbehave", "")).toBe(1);
    expect(calls("misbehave", "timeout")).toBe(1);
    const attempts = (error_type: string) =>
      sample(executorText, "toolmesh_tool_attempts_total", {
        gen_ai_tool_name: "misbehave",
        error_type,
      });
    expect([attempts(""), attempts("tool_error"), attempts("timeout")]).toEqual([1, 1, 3]);
    expect(
      sample(executorText, "toolmesh_tool_retries_total", { gen_ai_tool_name: "misbehave" }),
    ).toBe(3);
    expect(
      sample(executorText, "toolmesh_tool_timeouts_total", { gen_ai_tool_name: "misbehave" }),
    ).toBe(3);
    expect(
      sample(executorText, "toolmesh_tool_call_duration_count", {
        gen_ai_tool_name: "misbehave",
      }),
    ).toBe(2);
    expect(
      sample(executorText, "toolmesh_tool_queue_wait_count", {
        gen_ai_tool_name: "whoami",
      }),
    ).toBe(3);
    expect(sample(executorText, "toolmesh_tool_in_flight", { gen_ai_tool_name: "misbehave" })).toBe(
      0,
    );
    expect(sample(executorText, "toolmesh_tool_executors", { gen_ai_tool_name: "misbehave" })).toBe(
      1,
    );
    expect(
      sample(executorText, "toolmesh_tool_queue_pending", { gen_ai_tool_name: "misbehave" }),
    ).toBe(0);
    expect(executorText).toContain('service_name="obs-executor"');
    // No session or call id ever becomes a label.
    expect(executorText).not.toMatch(/obs-metrics|session_id|call_id/);

    const rejected = (error_type: string) =>
      sample(resolverText, "toolmesh_resolver_calls_total", {
        toolmesh_resolution: "rejected",
        error_type,
      });
    expect(rejected("invalid_parameters")).toBe(1);
    expect(rejected("unknown_tool")).toBe(1);
    // A made-up tool name is not a label; a registered one is.
    expect(resolverText).not.toContain("nosuch");
    expect(
      sample(resolverText, "toolmesh_resolver_calls_total", {
        error_type: "invalid_parameters",
        gen_ai_tool_name: "misbehave",
      }),
    ).toBe(1);
    const resolved = sample(resolverText, "toolmesh_resolver_calls_total", {
      toolmesh_resolution: "resolved",
    });
    expect(resolved).toBe(6); // flaky, echo, 3 whoami, hang

    expect(sample(bridgeText, "toolmesh_tool_calls_total", { gen_ai_tool_name: "t.echo" })).toBe(1);
    expect(
      sample(bridgeText, "toolmesh_mcp_request_duration_count", {
        toolmesh_mcp_server: "t",
      }),
    ).toBe(1);
    expect(
      sample(bridgeText, "toolmesh_mcp_server_state", {
        toolmesh_mcp_server: "t",
        toolmesh_mcp_state: "ready",
      }),
    ).toBe(1);

    const outcome = await runCli(["stats", "--json"], { NATS_URL: server.url });
    expect(outcome.code).toBe(0);
    const stats = JSON.parse(outcome.stdout) as {
      services: { service: string }[];
      tools: Record<string, unknown>[];
      resolver: { resolved: number; rejected: Record<string, number> };
      mcp_servers: Record<string, unknown>[];
    };
    expect(stats.services.map((s) => s.service).sort()).toEqual([
      "obs-bridge",
      "obs-executor",
      "obs-resolver",
    ]);
    const tool = (name: string) => stats.tools.find((t) => t.tool === name);
    expect(tool("misbehave")).toMatchObject({
      calls: { ok: calls("misbehave", ""), timeout: calls("misbehave", "timeout") },
      rejected: { invalid_parameters: rejected("invalid_parameters") },
      attempts: 5,
      retries: 3,
      timeouts: 3,
      in_flight: 0,
      executors: 1,
      queue: { pending: 0, ack_pending: 0 },
    });
    expect(tool("misbehave")?.error_rate).toBeCloseTo(2 / 3);
    expect(tool("misbehave")?.p99_ms).toEqual(expect.any(Number));
    expect(tool("whoami")).toMatchObject({ calls: { ok: 3 }, error_rate: 0, executors: 1 });
    expect(tool("t.echo")).toMatchObject({ calls: { ok: 1 }, executors: 1 });
    expect(stats.resolver).toEqual({
      resolved,
      rejected: { invalid_parameters: 1, unknown_tool: 1 },
    });
    expect(stats.mcp_servers).toEqual([
      expect.objectContaining({ server: "t", states: { ready: 1 }, restarts: 0, requests: 1 }),
    ]);
  });

  it("readiness names each check, the MCP server's included", async () => {
    const port = await portOf(bridge, "health served at /healthz and /readyz");
    const ready = await fetch(`http://127.0.0.1:${port}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({
      status: "ready",
      checks: {
        nats: { ok: true },
        consumers: { ok: true },
        draining: { ok: true },
        "mcp:t": { ok: true, detail: { state: "ready", tools: expect.any(Number) } },
      },
    });
    expect((await fetch(`http://127.0.0.1:${port}/healthz`)).status).toBe(200);
  });
});

describe("toolmesh call shows what a waiting call does", () => {
  it("prints progress lines on stderr when stderr is not a terminal, none with --quiet", async () => {
    const args = ["call", "t.count", "--args", '{"steps":3,"delay_ms":20}'];
    const plain = await runCli(args, { NATS_URL: server.url });
    expect(plain.code).toBe(0);
    expect(plain.stdout).toBe("counted to 3\n");
    expect(plain.stderr).toContain("progress t.count (attempt 1): step 1");
    expect(plain.stderr).toContain("step 3");
    const quiet = await runCli([...args, "--quiet"], { NATS_URL: server.url });
    expect(quiet).toMatchObject({ code: 0, stdout: "counted to 3\n", stderr: "" });
  });

  it("says what is missing when no executor takes the call", async () => {
    const gone = await startService("executor", {
      NATS_URL: server.url,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    });
    await toolAvailable(resolver, "sleepy");
    await gone.stop();
    const outcome = await runCli(["call", "sleepy", "--args", '{"ms":1}', "--timeout-ms", "4000"], {
      NATS_URL: server.url,
    });
    expect(outcome.stderr).toContain(
      'toolmesh: no executor serving "sleepy" is running: the call stays queued',
    );
    expect(outcome.stdout).toMatch(/^deadline_exceeded/);
  });

  it("says that no stream stores the calls of a prefix that was never set up", async () => {
    const outcome = await runCli(
      ["--prefix", "unset", "call", "echo", "--args", '{"text":"x"}', "--timeout-ms", "3000"],
      { NATS_URL: server.url },
    );
    expect(outcome.code).toBe(1);
    expect(outcome.stderr).toContain(
      "toolmesh: no stream UNSET_CALLS stores the calls of prefix unset: the call cannot be queued",
    );
    expect(outcome.stdout).toMatch(
      /^unavailable: no stream took the message on unset\.v1\.calls\.default\.\S+: none stores that subject/,
    );
  });

  it("cancels the call on Ctrl-C before exiting", async () => {
    const child = spawn(
      process.execPath,
      [BIN, "call", "t.count", "--args", '{"steps":100,"delay_ms":100}'],
      { env: { PATH: process.env.PATH ?? "", NATS_URL: server.url }, stdio: "pipe" },
    );
    let stderr = "";
    let stdout = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    const progressed = new Promise<void>((resolve) =>
      child.stderr.on("data", (chunk: Buffer) => {
        stderr += chunk.toString();
        if (stderr.includes("step 1")) resolve();
      }),
    );
    await progressed;
    child.kill("SIGINT");
    const [code] = (await once(child, "exit")) as [number];
    expect(code).toBe(130);
    expect(stderr).toContain("cancelling call");
    expect(stdout).toMatch(/^cancelled: /);
    // The cancel's own answer may come after the final message; it is not an error then.
    expect(stderr).not.toContain("cannot cancel");
  });
});

/** Runs a command in a real pseudo-terminal (util-linux `script`), typing `keys` on cue. */
async function inTerminal(
  command: string[],
  steps: { waitFor: RegExp; type?: string }[],
): Promise<{ code: number; screen: string }> {
  const quoted = command.map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(" ");
  const child = spawn("script", ["-qfec", `stty cols 120 rows 40; ${quoted}`, "/dev/null"], {
    env: { PATH: process.env.PATH ?? "", TERM: "xterm", NATS_URL: server.url },
    stdio: "pipe",
  });
  let screen = "";
  let wake: (() => void) | undefined;
  child.stdout.on("data", (chunk: Buffer) => {
    screen += chunk.toString();
    wake?.();
  });
  const exited = once(child, "exit") as Promise<[number]>;
  for (const step of steps) {
    const from = screen.length;
    while (!step.waitFor.test(screen.slice(Math.max(0, from - 200))))
      await new Promise<void>((resolve) => (wake = resolve));
    if (step.type !== undefined) child.stdin.write(step.type);
  }
  const [code] = await exited;
  return { code, screen };
}

describe("in a real terminal", () => {
  it("toolmesh top refreshes live, sorts, filters and quits on q", async () => {
    const { code, screen } = await inTerminal(
      [process.execPath, BIN, "top", "--interval-ms", "300"],
      [
        { waitFor: /sort calls/, type: "s" },
        { waitFor: /sort errors/, type: "/mis\r" },
        { waitFor: /filter "mis"/, type: "q" },
      ],
    );
    expect(code).toBe(0);
    expect(screen).toContain("\x1b[?1049h"); // the alternate screen, left on exit
    expect(screen).toMatch(/TOOL\s+CALLS\s+ERR\s+P50ms\s+P99ms\s+INFLIGHT\s+QUEUE\s+EXECUTORS/);
    const filtered = screen.slice(screen.lastIndexOf('filter "mis"'));
    expect(filtered).toMatch(/misbehave\s+\d+/);
    expect(filtered).not.toMatch(/whoami\s+\d+/);
    expect(screen.endsWith("\x1b[?25h\x1b[?1049l") || screen.includes("\x1b[?1049l")).toBe(true);
  });

  it("toolmesh call draws a progress bar on the terminal and clears it for the answer", async () => {
    const { code, screen } = await inTerminal(
      [process.execPath, BIN, "call", "t.count", "--args", '{"steps":4,"delay_ms":150}'],
      [{ waitFor: /counted to 4/ }],
    );
    expect(code).toBe(0);
    expect(screen).toMatch(/\[#{5}-{15}\] 25% t\.count/);
    expect(screen).toContain("\r\x1b[K");
    expect(screen).toMatch(/counted to 4\r?\n/);
  });
});

describe("watch, cancel and every command's manners", () => {
  it("toolmesh watch --session --json prints the session's call, progress and result as they happen", async () => {
    const child = spawn(
      process.execPath,
      [BIN, "watch", "--session", "obs-watch", "--json", "--limit", "3"],
      { env: { PATH: process.env.PATH ?? "", NATS_URL: server.url }, stdio: "pipe" },
    );
    let stdout = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    await new Promise<void>((resolve) =>
      child.stderr.on("data", (chunk: Buffer) => {
        if (chunk.toString().includes("watching session obs-watch")) resolve();
      }),
    );
    const exited = once(child, "exit") as Promise<[number]>;
    const session = client.session("obs-watch");
    const message = await session.submit({
      id: "w1",
      name: "t.count",
      arguments: { steps: 1, delay_ms: 1 },
    }).result;
    session.close();
    expect(message.error).toBeUndefined();
    const [code] = await exited;
    expect(code).toBe(0);
    const events = stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { type: string; session: string; call_id: string });
    expect(events.map((e) => [e.type, e.session, e.call_id])).toEqual([
      ["call", "obs-watch", "w1"],
      ["progress", "obs-watch", "w1"],
      ["result", "obs-watch", "w1"],
    ]);
  });

  it("toolmesh cancel says when the call had already ended, or is not known yet", async () => {
    const session = client.session("obs-cancel");
    await session.submit({ id: "done-1", name: "whoami", arguments: {} }).result;
    session.close();
    const outcome = await runCli(["cancel", "done-1", "--session", "obs-cancel"], {
      NATS_URL: server.url,
    });
    expect(outcome).toMatchObject({
      code: 1,
      stdout: "call done-1 had already ended; nothing to cancel\n",
    });
    // An id no call had yet: likely mistyped, and a call that comes with it is cancelled.
    const unknown = await runCli(["cancel", "typo-1", "--session", "obs-cancel"], {
      NATS_URL: server.url,
    });
    expect(unknown).toMatchObject({
      code: 1,
      stdout:
        "no call typo-1 in session obs-cancel yet; one that arrives is answered cancelled (check the call id and --session)\n",
    });
  });

  it("answers --version on every command and fails in one line, with the stack only at debug", async () => {
    for (const args of [["--version"], ["stats", "--version"], ["tools", "list", "--version"]]) {
      expect(await runCli(args, {})).toMatchObject({ code: 0, stdout: "0.1.0\n" });
    }
    const refused = await runCli(["tools", "list", "--server", "nats://127.0.0.1:1"], {});
    expect(refused).toMatchObject({
      code: 2,
      stderr: "toolmesh: cannot connect to NATS at nats://127.0.0.1:1: connection refused\n",
    });
    const debug = await runCli(
      ["tools", "list", "--server", "nats://127.0.0.1:1", "--log-level", "debug"],
      {},
    );
    expect(debug.stderr.split("\n")[0]).toBe(
      "toolmesh: cannot connect to NATS at nats://127.0.0.1:1: connection refused",
    );
    expect(debug.stderr).toMatch(/\n\s+at /);
  });

  it("exits quietly when its output pipe is closed", async () => {
    const child = spawn(process.execPath, [BIN, "tools", "list"], {
      env: { PATH: process.env.PATH ?? "", NATS_URL: server.url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout.destroy(); // like `| head -1` that has already exited
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const [code] = (await once(child, "exit")) as [number];
    expect(stderr).toBe("");
    expect(code).toBe(0);
  });
});
