import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { createSubjects } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  mcpClient,
  modernPost,
  startGateway,
  tallies,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { runCli } from "./helpers/cli.js";
import { eventually, until } from "./helpers/eventually.js";

// Approvals through the gateway (ADR 0059): a call that waits for its caller is answered, to a
// 2026-07-28 client that takes forms, with `input_required` asking to accept or decline; the
// retry (any replica, signed requestState) confirms or declines the waiting call. A task shows
// `input_required` for the caller and `working` for an operator. `tally` counts its executions
// per call id, so "ran once" and "never ran" are counted.

const MODERN = "2026-07-28";
const PYTHON_CLIENT = join(
  dirname(fileURLToPath(import.meta.url)),
  "fixtures",
  "gateway",
  "python-approval.py",
);
const STATE_KEY = "approvals-test-key-0123456789abcdef";
const POLICY = `@id("all")
permit (principal, action, resource);

@id("caller-confirms")
@approval("caller")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"tally")
when { context.args has ms && context.args.ms == 1 };

@id("operator-decides")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"tally")
when { context.args has ms && context.args.ms == 2 };

@id("caller-briefly")
@approval("caller")
@approval_ttl("2s")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"tally")
when { context.args has ms && context.args.ms == 3 };
`;

let server: NatsServerHandle;
let nc: NatsConnection;
let tools: string;
let env: Record<string, string>;
let gatewayEnv: Record<string, string>;
let a: { process: ServiceProcess; url: string };
let b: { process: ServiceProcess; url: string };

type Wire = { result?: Record<string, unknown>; error?: { code: number; message: string } };

/** One 2026-07-28 request on the wire, from a client that takes forms. */
async function modern(
  url: string,
  key: string,
  method: string,
  params: Record<string, unknown>,
): Promise<Wire> {
  const response = await modernPost(url, key, method, params, { elicitation: { form: {} } });
  return (await response.json()) as Wire;
}

/** The call id a requestState names (it is signed, not encrypted). */
function callIdOf(state: string): string {
  const body = state.slice(3, state.lastIndexOf("."));
  return (JSON.parse(Buffer.from(body, "base64url").toString("utf8")) as { p: { c: string } }).p.c;
}

const confirm = (action: "accept" | "decline" | "cancel") => ({
  confirm: action === "accept" ? { action, content: {} } : { action },
});

/** A tally call that waits for its caller: its input_required answer. */
async function asked(url: string, ms = 1): Promise<{ requestState: string; callId: string }> {
  const body = await modern(url, KEYS.acme, "tools/call", { name: "tally", arguments: { ms } });
  expect(body.result).toMatchObject({
    resultType: "input_required",
    inputRequests: {
      confirm: { method: "elicitation/create", params: { mode: "form" } },
    },
  });
  const requestState = body.result?.requestState as string;
  return { requestState, callId: callIdOf(requestState) };
}

function retry(
  url: string,
  requestState: string,
  action: "accept" | "decline" | "cancel",
  key: string = KEYS.acme,
): Promise<Wire> {
  return modern(url, key, "tools/call", {
    name: "tally",
    arguments: { ms: 1 },
    inputResponses: confirm(action),
    requestState,
  });
}

function structured(body: Wire): Record<string, unknown> {
  return (body.result as CallToolResult).structuredContent as Record<string, unknown>;
}

/** How often `tally` ran for the gateway call `callId` (keyed by its call key, tenant/session/key). */
async function ran(callId: string): Promise<number> {
  return (await tallies(tools)).get(`acme/${callId}/${callId}`) ?? 0;
}

beforeAll(async () => {
  server = await startNatsServer();
  let configs: string;
  let keys: Awaited<ReturnType<typeof writeKeysFile>>;
  [tools, configs, keys] = await Promise.all([gatewayTools(), gatewayAgents(), writeKeysFile()]);
  env = {
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
  await toolAvailable(resolver, "tally");
  nc = await connect({ servers: server.url });
  const store = new PolicyStore(await openPolicyBucket(nc, { subjects: createSubjects() }));
  const { revision } = await store.set(POLICY);
  await resolver.waitForLog(
    (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
  );
  gatewayEnv = {
    ...env,
    ...keys.env,
    TOOLMESH_GATEWAY_KEYS_FILE: keys.file,
    TOOLMESH_GATEWAY_REQUEST_STATE_KEY: STATE_KEY,
  };
  [a, b] = await Promise.all([startGateway(gatewayEnv), startGateway(gatewayEnv)]);
}, 150_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

describe("a call that waits for its caller, from a 2026-07-28 client that takes forms", () => {
  it("is confirmed by the TypeScript SDK client's form handler and runs once", async () => {
    const c = new Client(
      { name: "approvals-test", version: "1.0.0" },
      {
        versionNegotiation: { mode: { pin: MODERN } },
        capabilities: { elicitation: { form: {} } },
      },
    );
    const asks: unknown[] = [];
    c.setRequestHandler("elicitation/create", (request) => {
      asks.push(request.params);
      return Promise.resolve({ action: "accept", content: {} });
    });
    await c.connect(
      new StreamableHTTPClientTransport(new URL(a.url), {
        requestInit: { headers: { authorization: `Bearer ${KEYS.acme}` } },
      }),
    );
    try {
      const result = await c.callTool({ name: "tally", arguments: { ms: 1 } });
      expect(result.isError).toBeFalsy();
      const { key, count } = JSON.parse((result.content[0] as { text: string }).text) as {
        key: string;
        count: number;
      };
      expect(count).toBe(1);
      expect(asks).toHaveLength(1);
      expect(asks[0]).toMatchObject({ mode: "form", message: expect.stringMatching(/^Run tally/) });
      expect((await tallies(tools)).get(key)).toBe(1);
    } finally {
      await c.close();
    }
  });

  it("declined on another replica: approval_denied as a typed result, the tool never ran", async () => {
    const { requestState, callId } = await asked(a.url);
    const declined = await retry(b.url, requestState, "decline");
    expect((declined.result as CallToolResult).isError).toBe(true);
    expect(structured(declined)).toMatchObject({ code: "approval_denied" });
    expect(await ran(callId)).toBe(0);
    // The decision counts once: the same state again is refused.
    const again = await retry(a.url, requestState, "accept");
    expect(structured(again)).toMatchObject({ details: { request_state: "used" } });
    expect(await ran(callId)).toBe(0);
  });

  it("refuses another principal's answer, survives the asking replica's death, and runs once", async () => {
    const { requestState, callId } = await asked(a.url);
    // Another credential of the tenant, and another tenant: refused, the call still waits.
    for (const key of [KEYS.acmeWriter, KEYS.globex]) {
      const foreign = await retry(b.url, requestState, "accept", key);
      expect(structured(foreign)).toMatchObject({
        code: "invalid_request",
        details: { request_state: "foreign" },
      });
    }
    // Dismissed without a choice: refused, the call still waits.
    const dismissed = await retry(b.url, requestState, "cancel");
    expect(structured(dismissed)).toMatchObject({ code: "cancelled" });
    const task = await modern(b.url, KEYS.acme, "tasks/get", { taskId: callId });
    expect(task.result).toMatchObject({ taskId: callId, status: "input_required" });

    await a.process.kill();
    a = await startGateway(gatewayEnv);
    expect(await ran(callId)).toBe(0);
    const done = await retry(b.url, requestState, "accept");
    expect((done.result as CallToolResult).isError).toBeFalsy();
    expect(
      JSON.parse(((done.result as CallToolResult).content[0] as { text: string }).text),
    ).toEqual({ key: `acme/${callId}/${callId}`, count: 1 });
    const replayed = await retry(b.url, requestState, "accept");
    expect(structured(replayed)).toMatchObject({ details: { request_state: "used" } });
    expect(await ran(callId)).toBe(1);
  });
});

describe("the Python MCP SDK's Client pinned to 2026-07-28", () => {
  async function python(action: "accept" | "decline"): Promise<{
    asked: { message: string; properties: unknown }[];
    isError: boolean;
    text: string;
    structured: Record<string, unknown> | null;
  }> {
    const { stdout } = await promisify(execFile)(
      "python3",
      [PYTHON_CLIENT, b.url, KEYS.acme, action, "1"],
      { timeout: 60_000 },
    );
    return JSON.parse(stdout) as Awaited<ReturnType<typeof python>>;
  }

  it("confirms in its elicitation callback: the call runs once", async () => {
    const out = await python("accept");
    expect(out.asked).toHaveLength(1);
    expect(out.asked[0]?.message).toMatch(/^Run tally/);
    expect(out.isError).toBe(false);
    const { key, count } = JSON.parse(out.text) as { key: string; count: number };
    expect(count).toBe(1);
    expect((await tallies(tools)).get(key)).toBe(1);
  });

  it("declines in its elicitation callback: approval_denied, nothing ran", async () => {
    const before = [...(await tallies(tools)).values()].reduce((a, n) => a + n, 0);
    const out = await python("decline");
    expect(out.asked).toHaveLength(1);
    expect(out.isError).toBe(true);
    expect(out.structured).toMatchObject({ code: "approval_denied" });
    const after = [...(await tallies(tools)).values()].reduce((a, n) => a + n, 0);
    expect(after).toBe(before);
  });
});

describe("a task of a call that waits for a person", () => {
  it("shows input_required for the caller and is answered by tasks/update on another replica", async () => {
    const created = await modern(a.url, KEYS.acme, "tools/call", {
      name: "tally",
      arguments: { ms: 1 },
      task: { ttl: 60_000 },
    });
    const taskId = (created.result as { task: { taskId: string; status: string } }).task.taskId;
    const waiting = await modern(b.url, KEYS.acme, "tasks/get", { taskId });
    expect(waiting.result).toMatchObject({
      taskId,
      status: "input_required",
      inputRequests: { confirm: { method: "elicitation/create" } },
    });
    // Another tenant: as for a task that does not exist.
    const foreign = await modern(b.url, KEYS.globex, "tasks/get", { taskId });
    expect(foreign.error?.message).toMatch(/Task not found/);
    const updated = await modern(b.url, KEYS.acme, "tasks/update", {
      taskId,
      inputResponses: confirm("accept"),
      requestState: waiting.result?.requestState,
    });
    expect(updated.error).toBeUndefined();
    const done = await eventually("the task completed", async () => {
      const got = await modern(a.url, KEYS.acme, "tasks/get", { taskId });
      return got.result?.status === "completed" ? got.result : undefined;
    });
    const result = done.result as CallToolResult;
    expect(result.isError).toBeFalsy();
    expect(JSON.parse((result.content[0] as { text: string }).text)).toMatchObject({ count: 1 });
    expect(await ran(taskId)).toBe(1);
  });

  it("shows working with who it waits for, and completes once an operator approves, after its gateway died", async () => {
    const created = await modern(a.url, KEYS.acme, "tools/call", {
      name: "tally",
      arguments: { ms: 2 },
      task: { ttl: 60_000 },
    });
    const taskId = (created.result as { task: { taskId: string } }).task.taskId;
    const waiting = await modern(b.url, KEYS.acme, "tasks/get", { taskId });
    expect(waiting.result).toMatchObject({ taskId, status: "working" });
    expect(waiting.result?.statusMessage).toMatch(
      new RegExp(`operator.*toolmesh approvals approve ${taskId}`),
    );
    expect(waiting.result?.requestState).toBeUndefined();
    // The replica that created the task dies while the call waits: nothing is lost.
    await a.process.kill();
    a = await startGateway(gatewayEnv);
    const approved = await runCli(["--tenant", "acme", "approvals", "approve", taskId], env);
    expect(approved.code).toBe(0);
    await until("the task completed", async () => {
      const got = await modern(b.url, KEYS.acme, "tasks/get", { taskId });
      return got.result?.status === "completed";
    });
    expect(await ran(taskId)).toBe(1);
  });
});

describe("a client that cannot answer input_required", () => {
  it("a legacy client's call waits as any mesh call does, and ends approval_expired if nobody confirms", async () => {
    const c = await mcpClient(b.url, KEYS.acme);
    try {
      const result = await c.callTool({ name: "tally", arguments: { ms: 3 } });
      expect(result.isError).toBe(true);
      expect(result.structuredContent).toMatchObject({ code: "approval_expired" });
    } finally {
      await c.close();
    }
  });
});
