import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { ToolmeshClient } from "@toolmesh/client";
import type { SessionEvent } from "@toolmesh/client";
import { createSubjects } from "@toolmesh/protocol";
import type { ToolMessage } from "@toolmesh/protocol";
import type { Telemetry } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { present } from "./helpers/present.js";
import { until } from "./helpers/eventually.js";
import { freshTelemetry, startOtlpReceiver } from "./helpers/otlp-receiver.js";
import type { CollectedSpan, OtlpReceiver } from "./helpers/otlp-receiver.js";

let server: NatsServerHandle;
let receiver: OtlpReceiver;
let telemetry: Telemetry;
let nc: NatsConnection;
let client: ToolmeshClient;
let resolver: ServiceProcess;
let executors: ServiceProcess[];
let env: Record<string, string>;

const json = (message: ToolMessage): Record<string, unknown> =>
  JSON.parse(message.content) as Record<string, unknown>;

beforeAll(async () => {
  [server, receiver] = await Promise.all([startNatsServer(), startOtlpReceiver()]);
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-a"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ units: "metric", region: "eu" }),
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: "50",
  };
  resolver = await startService("resolver", env);
  executors = await Promise.all([startService("executor", env), startService("executor", env)]);
  await toolAvailable(resolver, "inspect", "misbehave", "whoami");
  telemetry = await freshTelemetry({ serviceName: "test-frontend", env });
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc, { tracer: telemetry.tracer, defaultTimeoutMs: 15_000 });
});

afterAll(async () => {
  await nc?.close();
  await telemetry?.shutdown();
  await killAllServices();
  await Promise.all([server?.stop(), receiver?.close()]);
});

describe("a call through separate resolver and executor processes", () => {
  it("fills defaults, nested ones too, injects presets and merges the execution context", async () => {
    const session = client.session("s-end-to-end");
    const message = await session.submit(
      { id: "c1", name: "inspect", arguments: '{"query":"cu bulk","options":{"lang":"de"}}' },
      { context: { user: "ada" }, agentContext: { user: "agent-default", units: "imperial" } },
    ).result;
    session.close();
    expect(message.error).toBeUndefined();
    expect(message).toMatchObject({
      role: "tool",
      tool_call_id: "c1",
      name: "inspect",
      session_id: "s-end-to-end",
    });
    const body = json(message);
    expect(body.args).toEqual({
      query: "cu bulk",
      limit: 10,
      options: { lang: "de", deep: true },
      token: "preset-secret-value",
    });
    // call-level over agent-level over toolkit-level
    expect(body.context).toEqual({ user: "ada", units: "imperial", region: "eu" });
    expect(body.idempotencyKey).toBe("default/s-end-to-end/s-end-to-end/c1");
  });

  it("keeps preset values out of the registry, the call records and every log line", async () => {
    const session = client.session("s-presets");
    await session.submit({
      id: "p1",
      name: "inspect",
      arguments: { query: "x", token: "model-tries-this" },
    }).result;
    session.close();
    const kvEntry = await client.resolve("s-presets", {
      name: "inspect",
      arguments: { query: "x" },
    });
    expect(kvEntry.ok).toBe(true);
    const all = [resolver, ...executors].flatMap((p) => p.lines).map((l) => JSON.stringify(l));
    expect(all.some((l) => l.includes("preset-secret-value"))).toBe(false);
    const jsm = await jetstreamManager(nc);
    // Consumed work leaves the work queue once its executor acknowledges it, just after the
    // result it published.
    await until("the work queue to be empty", async () => {
      const work = await jsm.streams.info(createSubjects().streams.work);
      return work.state.messages === 0;
    });
  });

  it("says in each registry entry whether the tool emits progress", async () => {
    const kv = await new Kvm(nc).open(createSubjects().registryBucket);
    const progressOf = async (name: string): Promise<unknown> =>
      ((await kv.get(name))?.json<{ progress?: boolean }>() ?? {}).progress;
    expect(await progressOf("inspect")).toBe(true);
    expect(await progressOf("whoami")).toBe(false);
  });

  it("splits one tool's work between two executor processes", async () => {
    const session = client.session("s-split");
    const { results } = session.submitAll(
      Array.from({ length: 24 }, (_, i) => ({
        id: `w${i}`,
        name: "whoami",
        arguments: { delay_ms: 60 },
      })),
    );
    const pids = new Set((await results).map((m) => json(m).pid));
    session.close();
    expect(pids).toEqual(new Set(executors.map((e) => e.pid)));
  });

  it("calls a tool registered while the mesh runs, even one whose name holds a dot", async () => {
    const session = client.session("s-late");
    const before = await session.submit({ id: "l0", name: "late.arrival", arguments: {} }).result;
    expect(before.error?.code).toBe("unknown_tool");
    const late = await startService("executor", {
      ...env,
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-b"),
      TOOLMESH_EXECUTOR_OWNER: "executor-b",
    });
    await toolAvailable(resolver, "late.arrival");
    const after = await session.submit({ id: "l1", name: "late.arrival", arguments: { n: 21 } })
      .result;
    session.close();
    await late.stop();
    expect(after.error).toBeUndefined();
    expect(json(after)).toEqual({ doubled: 42 });
  });

  it("answers invalid calls at once with typed errors and keeps going", async () => {
    const session = client.session("s-invalid");
    const results = await session.submitAll([
      { id: "i1", name: "inspect", arguments: '{"query": "unterminated' },
      { id: "i2", name: "inspect", arguments: "[1,2]" },
      { id: "i3", name: "inspekt", arguments: "{}" },
      { id: "i4", name: "inspect", arguments: '{"limit": 3}' },
      { id: "i5", name: "inspect", arguments: '{"query": "q", "limit": "ten"}' },
      { id: "i6", name: "inspect", arguments: '{"query": "still works"}' },
    ]).results;
    const answer = (i: number): ToolMessage => present(results[i], `the answer to call ${i + 1}`);
    const badJson = answer(0);
    const notObject = answer(1);
    const unknown = answer(2);
    const missing = answer(3);
    const wrongType = answer(4);
    const valid = answer(5);
    session.close();
    expect(badJson.error).toMatchObject({ code: "invalid_arguments", retryable: false });
    expect(badJson.error?.details).toMatchObject({ line: 1 });
    expect(notObject.error).toMatchObject({
      code: "invalid_arguments",
      details: { received: "array" },
    });
    expect(unknown.error).toMatchObject({
      code: "unknown_tool",
      details: { close_matches: ["inspect"] },
    });
    expect(missing.error).toMatchObject({
      code: "missing_arguments",
      details: { missing_required: ["query"] },
    });
    expect(wrongType.error?.code).toBe("invalid_parameters");
    expect(wrongType.error?.details?.errors).toEqual([
      expect.objectContaining({
        path: "/limit",
        keyword: "type",
        expected: "integer",
        received: "ten",
      }),
    ]);
    expect(valid.error).toBeUndefined();
  });

  it("publishes a missing-arguments event for the schema expander", async () => {
    const jsm = await jetstreamManager(nc);
    const subjects = createSubjects();
    const session = client.session("s-missing-event");
    await session.submit({ id: "m1", name: "inspect", arguments: "{}" }).result;
    session.close();
    const msg = await jsm.streams.getMessage(subjects.streams.events, {
      last_by_subj: subjects.missingArguments(
        subjects.address("default", "s-missing-event"),
        "inspect",
      ),
    });
    expect(msg?.json()).toMatchObject({
      tool: "inspect",
      session_id: "s-missing-event",
      missing_required: ["query"],
    });
  });

  it("streams progress to the session before the result", async () => {
    const session = client.session("s-progress");
    const events: SessionEvent[] = [];
    session.onEvent((e) => events.push(e));
    await session.submit({ id: "g1", name: "inspect", arguments: { query: "p" } }).result;
    session.close();
    const kinds = events.map((e) => e.type);
    expect(kinds).toEqual(["progress", "result"]);
    expect(events[0]).toMatchObject({
      type: "progress",
      event: { tool_call_id: "g1", seq: 0, attempt: 1, data: { stage: "received" } },
    });
  });

  it("answers a dry run with the resolved-call record and its provenance", async () => {
    const reply = await client.resolve(
      "s-dry",
      { id: "d1", name: "inspect", arguments: { query: "q" } },
      { edgeParams: ["limit"] },
    );
    expect(reply.ok).toBe(true);
    if (!reply.ok) return;
    expect(reply.resolved.input_parameters).toEqual([
      { name: "query", type: "str", value: "q", source: "tool_args" },
      { name: "limit", type: "int", value: "", source: "edge" },
      { name: "options", type: "dict", value: { deep: true, lang: "en" }, source: "default" },
    ]);
  });
});

describe("timeouts and retries", () => {
  it("retries a transient failure and succeeds on the next attempt", async () => {
    const session = client.session("s-flaky");
    const message = await session.submit({
      id: "f1",
      name: "misbehave",
      arguments: { mode: "flaky" },
    }).result;
    session.close();
    expect(message.error).toBeUndefined();
    expect(json(message)).toEqual({ attempt: 2, ok: true });
    expect(message.attempts).toBe(2);
  });

  it("gives up after max_attempts with tool_error", async () => {
    const session = client.session("s-throw");
    const message = await session.submit({
      id: "t1",
      name: "misbehave",
      arguments: { mode: "throw" },
    }).result;
    session.close();
    expect(message.error).toMatchObject({ code: "tool_error", message: "boom" });
    expect(message.attempts).toBe(3);
  });

  it("does not retry a terminal error", async () => {
    const session = client.session("s-terminal");
    const message = await session.submit({
      id: "t2",
      name: "misbehave",
      arguments: { mode: "terminal" },
    }).result;
    session.close();
    expect(message.error).toMatchObject({ code: "tool_error", retryable: false });
    expect(message.attempts).toBe(1);
  });

  it("aborts a hung attempt at its timeout and reports timeout after the last attempt", async () => {
    const session = client.session("s-hang");
    const message = await session.submit({
      id: "h1",
      name: "misbehave",
      arguments: { mode: "hang" },
    }).result;
    session.close();
    expect(message.error).toMatchObject({ code: "timeout", retryable: true });
    expect(message.attempts).toBe(3);
  });
});

describe("tracing", () => {
  it("links every hop of one call into one trace", async () => {
    const session = client.session("s-trace");
    await session.submit({ id: "tr1", name: "whoami", arguments: {} }).result;
    session.close();
    await telemetry.forceFlush();
    // Spans arrive from three processes in any order: wait for the whole chain.
    const chainOf = (spans: CollectedSpan[]): string[] => {
      const call = spans.find(
        (s) => s.name === "send" && s.attributes["gen_ai.tool.call.id"] === "tr1",
      );
      const byId = new Map(
        spans.filter((s) => s.traceId === call?.traceId).map((s) => [s.spanId, s]),
      );
      const chain: string[] = [];
      let s = [...byId.values()].find((x) => x.name === "execute_tool whoami");
      while (s !== undefined) {
        chain.push(`${s.service}:${s.name}`);
        s = s.parentSpanId === undefined ? undefined : byId.get(s.parentSpanId);
      }
      return chain;
    };
    const chain = chainOf(await receiver.waitFor((spans) => chainOf(spans).length >= 4));
    expect(chain).toEqual([
      "toolmesh-executor:execute_tool whoami",
      "toolmesh-executor:process whoami",
      "toolmesh-resolver:resolve",
      "test-frontend:send",
    ]);
  });
});
