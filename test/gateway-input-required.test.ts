import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  modernPost,
  startGateway,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// input_required through the mesh: a 2026-07-28 call missing required arguments is answered with
// a form for exactly those, and the retry carrying the answer (on any replica) submits the same
// call id again; its signed requestState is refused when forged, altered, expired, another
// principal's, for another request or already answered.

const MODERN = "2026-07-28";
const PYTHON_CLIENT = join(
  dirname(fileURLToPath(import.meta.url)),
  "fixtures",
  "gateway",
  "python-input-required.py",
);
const STATE_KEY = "input-required-test-key-0123456789abcdef";
let server: NatsServerHandle;
/** Two replicas sharing the key; `short` issues states that expire after a second. */
let a: { url: string };
let b: { url: string };
let short: { url: string };
const clients: Client[] = [];

type Wire = { result?: Record<string, unknown>; error?: { code: number; message: string } };

/** One 2026-07-28 request on the wire, from a client that takes forms unless told otherwise. */
async function modern(
  url: string,
  key: string,
  method: string,
  params: Record<string, unknown>,
  capabilities: Record<string, unknown> = { elicitation: { form: {} } },
): Promise<Wire> {
  const response = await modernPost(url, key, method, params, capabilities);
  return (await response.json()) as Wire;
}

const STRICT = { name: "strict", arguments: { name: "n" } };

/** A strict call missing `count`: its input_required answer. */
async function asked(url: string, key: string = KEYS.acme): Promise<Record<string, unknown>> {
  const body = await modern(url, key, "tools/call", STRICT);
  expect(body.result).toMatchObject({ resultType: "input_required" });
  return body.result ?? {};
}

const answer = (count: unknown) => ({
  arguments: { action: "accept", content: { count } },
});

/** The retry of the strict call with an answer and a requestState. */
function retry(
  url: string,
  requestState: string,
  options: { key?: string; inputResponses?: unknown; arguments?: unknown } = {},
): Promise<Wire> {
  return modern(url, options.key ?? KEYS.acme, "tools/call", {
    name: "strict",
    arguments: options.arguments ?? STRICT.arguments,
    inputResponses: options.inputResponses ?? answer(3),
    requestState,
  });
}

/** The typed refusal of a requestState, as `details.request_state`. */
function refusalOf(body: Wire): unknown {
  const result = body.result as CallToolResult | undefined;
  expect(result?.isError).toBe(true);
  expect(result?.structuredContent).toMatchObject({ code: "invalid_request" });
  return (result?.structuredContent as { details: { request_state: unknown } }).details
    .request_state;
}

/** What a requestState names (it is signed, not encrypted). */
function payloadOf(state: string): { c: string } {
  const body = state.slice(3, state.lastIndexOf("."));
  return (JSON.parse(Buffer.from(body, "base64url").toString("utf8")) as { p: { c: string } }).p;
}

function textOf(body: Wire): string {
  const result = body.result as CallToolResult;
  return (result.content[0] as { text: string }).text;
}

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
  await toolAvailable(resolver, "strict", "slow");
  const gatewayEnv = {
    ...env,
    ...keys.env,
    TOOLMESH_GATEWAY_KEYS_FILE: keys.file,
    TOOLMESH_GATEWAY_REQUEST_STATE_KEY: STATE_KEY,
  };
  [a, b, short] = await Promise.all([
    startGateway(gatewayEnv),
    startGateway(gatewayEnv),
    startGateway({ ...gatewayEnv, TOOLMESH_GATEWAY_REQUEST_STATE_TTL_MS: "1000" }),
  ]);
}, 150_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  await killAllServices();
  await server?.stop();
});

describe("a call missing required arguments, to a 2026-07-28 client that takes forms", () => {
  it("is answered by the TypeScript SDK client's form handler and runs with the answer", async () => {
    const c = new Client(
      { name: "input-test", version: "1.0.0" },
      {
        versionNegotiation: { mode: { pin: MODERN } },
        capabilities: { elicitation: { form: {} } },
      },
    );
    const asks: unknown[] = [];
    c.setRequestHandler("elicitation/create", (request) => {
      asks.push(request.params);
      return Promise.resolve({ action: "accept", content: { count: 7 } });
    });
    await c.connect(
      new StreamableHTTPClientTransport(new URL(a.url), {
        requestInit: { headers: { authorization: `Bearer ${KEYS.acme}` } },
      }),
    );
    clients.push(c);
    const result = await c.callTool({ name: "strict", arguments: { name: "typed" } });
    expect(result.isError).toBeFalsy();
    expect(JSON.parse((result.content[0] as { text: string }).text)).toEqual({
      args: { name: "typed", count: 7, mode: "fast" },
    });
    // One form, asking for exactly the missing argument with its schema from the tool.
    expect(asks).toHaveLength(1);
    expect(asks[0]).toMatchObject({
      mode: "form",
      requestedSchema: {
        type: "object",
        properties: { count: { type: "integer", minimum: 0 } },
        required: ["count"],
      },
    });
  });

  it("resumes the same call id on another replica, once", async () => {
    const first = await asked(a.url);
    const requestState = first.requestState as string;
    expect(first.inputRequests).toMatchObject({
      arguments: {
        method: "elicitation/create",
        params: { requestedSchema: { required: ["count"] } },
      },
    });
    const done = await retry(b.url, requestState);
    expect((done.result as CallToolResult).isError).toBeFalsy();
    expect(JSON.parse(textOf(done))).toEqual({ args: { name: "n", count: 3, mode: "fast" } });
    // The call that ran is the one the state names: its task, of this credential, completed.
    const { c: callId } = payloadOf(requestState);
    const task = await modern(a.url, KEYS.acme, "tasks/get", { taskId: callId });
    expect(task.result).toMatchObject({ taskId: callId, status: "completed" });
    // Replayed after use, on either replica: refused, and nothing runs again.
    expect(refusalOf(await retry(a.url, requestState))).toBe("used");
    expect(refusalOf(await retry(b.url, requestState, { inputResponses: answer(9) }))).toBe("used");
  });

  it("refuses a forged, altered, foreign or mismatched requestState, and the call stays answerable", async () => {
    const requestState = (await asked(a.url)).requestState as string;
    const [prefix, body, mac] = [
      requestState.slice(0, 3),
      requestState.slice(3, requestState.lastIndexOf(".")),
      requestState.slice(requestState.lastIndexOf(".") + 1),
    ];
    const envelope = JSON.parse(Buffer.from(body, "base64url").toString("utf8")) as {
      p: { c: string };
      exp: number;
    };
    const altered = (change: (e: typeof envelope) => void): string => {
      const copy = structuredClone(envelope);
      change(copy);
      return `${prefix}${Buffer.from(JSON.stringify(copy)).toString("base64url")}.${mac}`;
    };
    const forged = `v1.${Buffer.from(JSON.stringify({ p: envelope.p, exp: envelope.exp })).toString("base64url")}.${Buffer.alloc(32).toString("base64url")}`;

    expect(refusalOf(await retry(b.url, forged))).toBe("invalid");
    expect(refusalOf(await retry(b.url, "not a state"))).toBe("invalid");
    expect(
      refusalOf(
        await retry(
          b.url,
          altered((e) => (e.exp += 3600)),
        ),
      ),
    ).toBe("invalid");
    expect(
      refusalOf(
        await retry(
          b.url,
          altered((e) => (e.p.c = `${e.p.c}0`)),
        ),
      ),
    ).toBe("invalid");
    // Another credential of the same tenant, and another tenant: not theirs.
    expect(refusalOf(await retry(b.url, requestState, { key: KEYS.acmeWriter }))).toBe("foreign");
    expect(refusalOf(await retry(b.url, requestState, { key: KEYS.globex }))).toBe("foreign");
    // The same state for other arguments than the request it answered.
    expect(refusalOf(await retry(b.url, requestState, { arguments: { name: "other" } }))).toBe(
      "mismatch",
    );
    // None of it touched the call: its own answer still resumes it.
    const done = await retry(a.url, requestState, { inputResponses: answer(5) });
    expect(JSON.parse(textOf(done))).toEqual({ args: { name: "n", count: 5, mode: "fast" } });
  });

  it("refuses an expired requestState, and a new round asks again", async () => {
    const requestState = (await asked(short.url)).requestState as string;
    await new Promise((resolve) => setTimeout(resolve, 2_200));
    expect(refusalOf(await retry(a.url, requestState))).toBe("expired");
    const again = (await asked(a.url)).requestState as string;
    expect(JSON.parse(textOf(await retry(b.url, again)))).toEqual({
      args: { name: "n", count: 3, mode: "fast" },
    });
  });

  it("answers a declined form as cancelled, and a wrong value with the tool's own error", async () => {
    const declined = await retry(a.url, (await asked(a.url)).requestState as string, {
      inputResponses: { arguments: { action: "decline" } },
    });
    expect((declined.result as CallToolResult).structuredContent).toMatchObject({
      code: "cancelled",
    });
    const wrong = await retry(a.url, (await asked(a.url)).requestState as string, {
      inputResponses: answer("three"),
    });
    expect((wrong.result as CallToolResult).structuredContent).toMatchObject({
      code: "invalid_parameters",
    });
  });
});

describe("the Python MCP SDK's Client pinned to 2026-07-28", () => {
  it("fills the form in its elicitation callback and gets the call's result", async () => {
    const { stdout } = await promisify(execFile)("python3", [PYTHON_CLIENT, a.url, KEYS.acme], {
      timeout: 60_000,
    });
    const out = JSON.parse(stdout) as { asked: unknown[]; isError: boolean; text: string };
    expect(out.asked).toEqual([
      { required: ["count"], properties: { count: { type: "integer", minimum: 0 } } },
    ]);
    expect(out.isError).toBe(false);
    expect(JSON.parse(out.text)).toEqual({ args: { name: "py", count: 4, mode: "fast" } });
  });
});

describe("a call missing required arguments, to a client that takes no forms", () => {
  it("is answered missing_arguments, as before", async () => {
    const body = await modern(a.url, KEYS.acme, "tools/call", STRICT, {});
    expect((body.result as CallToolResult).structuredContent).toMatchObject({
      code: "missing_arguments",
    });
    const legacy = new Client(
      { name: "input-test", version: "1.0.0" },
      { versionNegotiation: { mode: "legacy" }, capabilities: { elicitation: { form: {} } } },
    );
    await legacy.connect(
      new StreamableHTTPClientTransport(new URL(a.url), {
        requestInit: { headers: { authorization: `Bearer ${KEYS.acme}` } },
      }),
    );
    clients.push(legacy);
    const result = await legacy.callTool(STRICT);
    expect(result.structuredContent).toMatchObject({ code: "missing_arguments" });
  });
});

describe("tasks/update", () => {
  it("refuses a forged or foreign requestState with a typed error; the task goes on", async () => {
    const created = await modern(a.url, KEYS.acme, "tools/call", {
      name: "slow",
      arguments: { ms: 30_000, value: "update" },
      task: { ttl: 60_000 },
    });
    const taskId = (created.result as { task: { taskId: string } }).task.taskId;
    const forged = await modern(b.url, KEYS.acme, "tasks/update", {
      taskId,
      inputResponses: answer(1),
      requestState: "v1.e30.AAAA",
    });
    expect(forged.error?.message).toMatch(/requestState is not one this gateway issued/);
    // A state issued for another call of the same credential names another task.
    const other = (await asked(a.url)).requestState as string;
    const mismatched = await modern(b.url, KEYS.acme, "tasks/update", {
      taskId,
      inputResponses: answer(1),
      requestState: other,
    });
    expect(mismatched.error?.message).toMatch(/issued for another request/);
    const task = await modern(b.url, KEYS.acme, "tasks/get", { taskId });
    expect(task.result).toMatchObject({ taskId, status: "working" });
    await modern(a.url, KEYS.acme, "tasks/cancel", { taskId });
  });
});
