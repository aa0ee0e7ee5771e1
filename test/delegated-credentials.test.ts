import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import type { CallToolResult } from "@modelcontextprotocol/client";
import { jetstreamManager } from "@nats-io/jetstream";
import type { ApprovalEntry } from "@toolmesh/protocol";
import { ErrorCode, createSubjects } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { exchange, startAuthServer } from "./helpers/auth-server.js";
import type { AuthServer } from "./helpers/auth-server.js";
import { runCli } from "./helpers/cli.js";
import { eventually } from "./helpers/eventually.js";
import { gatewayAgents, mcpClient, modernPost, startGateway } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import { startTestMcpServer } from "./helpers/mcp-test-server.js";
import type { TestMcpServer } from "./helpers/mcp-test-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// Tools that act as their caller with a token the authorization server issues for the tool's
// audience when the call runs (RFC 8693 token exchange, deferred delegation). A real
// authorization server (oidc-provider, its own process, its clock movable) and a real API that
// checks the bearer token's subject and audience against the server's keys.

const GATEWAY_AUDIENCE = "https://tools.example.test/mcp";
const API_AUDIENCE = "https://api.example.test/";
const CLIENT_SECRET = `client-${randomBytes(8).toString("hex")}`;
const KEYS = `k1:${randomBytes(32).toString("base64")}`;
const subjects = createSubjects();

const WHOAMI = (name: string, api: string) => `export default {
  name: ${JSON.stringify(name)},
  description: "Asks the API who the caller is, with a token issued for the caller.",
  parameters: { type: "object", properties: {} },
  credentials: { type: "token-exchange", audience: ${JSON.stringify(API_AUDIENCE)}, scopes: ["api:read"] },
  async handler(_args, ctx) {
    const res = await fetch(${JSON.stringify(api)}, { headers: { authorization: "Bearer " + ctx.credential } });
    if (!res.ok) throw Object.assign(new Error("api said " + res.status), { retryable: false });
    return await res.json();
  },
};
`;

// Calls of whoami_held wait for an operator: they run when a person approves them.
const POLICY = `@id("all")
permit (principal, action, resource);

@id("held")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"whoami_held");
`;

let server: NatsServerHandle;
let as: AuthServer;
let gateway: { url: string; process: ServiceProcess };
let services: ServiceProcess[];
let nc: NatsConnection;
const seen: { subject: string; text: string }[] = [];

async function admin<T = Record<string, unknown>>(path: string, body?: unknown): Promise<T> {
  return as.admin<T>(path, body);
}

async function login(sub: string): Promise<string> {
  return (await admin<{ token: string }>("login", { sub, tenant: "acme" })).token;
}

async function call(token: string, tool: string): Promise<{ text: string; isError: boolean }> {
  const c = await mcpClient(gateway.url, token);
  try {
    const result = await c.callTool({ name: tool, arguments: {} });
    return {
      text: (result.content[0] as { text: string }).text,
      isError: result.isError === true,
    };
  } finally {
    await c.close();
  }
}

async function held(tool: string): Promise<ApprovalEntry> {
  return eventually(`a call of ${tool} waiting`, async () => {
    const out = await runCli(["--tenant", "acme", "approvals", "list", "--json"], {
      NATS_URL: server.url,
    });
    return (JSON.parse(out.stdout) as ApprovalEntry[]).find((e) => e.tool === tool);
  });
}

async function approve(callId: string): Promise<void> {
  const out = await runCli(["--tenant", "acme", "approvals", "approve", callId], {
    NATS_URL: server.url,
  });
  expect(out.code).toBe(0);
}

const MODERN = "2026-07-28";

/**
 * A call from the TypeScript SDK's client pinned to 2026-07-28, declaring `elicitation`
 * (`capability`), whose handler `onAsk` answers each question the gateway asks.
 */
async function modernCall(
  token: string,
  tool: string,
  capability: { form?: Record<string, never>; url?: Record<string, never> },
  onAsk: (params: { mode?: string; url?: string; message: string }) => Promise<string>,
): Promise<CallToolResult> {
  const c = new Client(
    { name: "consent-test", version: "1.0.0" },
    { versionNegotiation: { mode: { pin: MODERN } }, capabilities: { elicitation: capability } },
  );
  c.setRequestHandler("elicitation/create", async (request) => ({
    action: (await onAsk(request.params as never)) as "accept",
  }));
  await c.connect(
    new StreamableHTTPClientTransport(new URL(gateway.url), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    }),
  );
  try {
    return await c.callTool({ name: tool, arguments: {} });
  } finally {
    await c.close();
  }
}

type Wire = { result?: Record<string, unknown> };

/** One raw 2026-07-28 request of a client that takes URL-mode elicitation. */
async function rawRequest(
  token: string,
  method: string,
  params: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  const response = await modernPost(gateway.url, token, method, params, {
    elicitation: { url: {} },
  });
  return ((await response.json()) as Wire).result ?? {};
}

/** A raw `tools/call` of `tool` with no arguments; `extra` adds to its parameters. */
function rawCall(token: string, tool: string, extra: Record<string, unknown> = {}) {
  return rawRequest(token, "tools/call", { name: tool, arguments: {}, ...extra });
}

/** The calls the mesh holds a record of for tenant acme. */
async function recordCount(): Promise<number> {
  const kv = await new Kvm(nc).open(subjects.callsBucket);
  let n = 0;
  for await (const _ of await kv.keys("acme.>")) n++;
  return n;
}

/** The services' environment without the token endpoint and keys; the executors' with them. */
let baseEnv: Record<string, string>;
let executorEnv: Record<string, string>;
let bridgeEnv: Record<string, string>;
let mcpServer: TestMcpServer;

beforeAll(async () => {
  server = await startNatsServer();
  as = await startAuthServer({
    gatewayAudience: GATEWAY_AUDIENCE,
    apiAudience: API_AUDIENCE,
    clientId: "toolmesh",
    clientSecret: CLIENT_SECRET,
  });
  nc = await connect({ servers: server.url });
  const spy = await connect({ servers: server.url });
  spy.subscribe(">", {
    callback: (_err, msg) => {
      const headers = msg.headers;
      const values = headers === undefined ? [] : headers.keys().map((k) => headers.get(k));
      seen.push({ subject: msg.subject, text: `${values.join(" ")} ${msg.string()}` });
    },
  });
  afterAllClose.push(() => spy.close());
  // The bucket of users' secrets, as `toolmesh setup` makes it.
  await new Kvm(nc).create(subjects.userSecretsBucket, { history: 1 });
  await new PolicyStore(await openPolicyBucket(nc, { subjects })).set(POLICY);
  const api = `${as.url}/api/whoami`;
  const tools = await mkdtemp(join(tmpdir(), "toolmesh-delegation-"));
  await writeFile(join(tools, "whoami.js"), WHOAMI("whoami", api));
  await writeFile(join(tools, "whoami_held.js"), WHOAMI("whoami_held", api));
  const native = await mkdtemp(join(tmpdir(), "toolmesh-delegation-http-"));
  await writeFile(
    join(native, "whoami_http.yaml"),
    `name: whoami_http\ndescription: The caller, as the API sees them.\napi_url: ${api}\ncredentials:\n  type: token-exchange\n  audience: ${API_AUDIENCE}\n`,
  );
  // An MCP server over HTTP whose tool asks the API who the caller is, with the Authorization
  // its tools/call request came with; the bridge sends a token issued for each caller.
  mcpServer = await startTestMcpServer("--http", { MCP_TEST_CALLER_API: api });
  const mcp = await mkdtemp(join(tmpdir(), "toolmesh-delegation-mcp-"));
  await writeFile(
    join(mcp, "api.yaml"),
    `name: api\ntransport: http\nurl: ${mcpServer.url}\ncredentials:\n  type: token-exchange\n  audience: ${API_AUDIENCE}\n  scopes: [api:read]\n`,
  );
  const token = {
    TOOLMESH_TOKEN_URL: `${as.url}/token`,
    TOOLMESH_TOKEN_CLIENT_ID: "toolmesh",
    TOOLMESH_TOKEN_CLIENT_SECRET: CLIENT_SECRET,
  };
  const env = (baseEnv = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_NATIVE_TOOLS_DIR: native,
    TOOLMESH_CONFIG_DIR: await gatewayAgents(),
  });
  executorEnv = { ...env, ...token, TOOLMESH_SECRET_KEYS: KEYS };
  bridgeEnv = { ...executorEnv, TOOLMESH_MCP_DIR: mcp };
  services = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", executorEnv, 60_000),
    startService("mcp-bridge", bridgeEnv, 60_000),
  ]);
  await toolAvailable(services[0] as ServiceProcess, "api.caller");
  await toolAvailable(services[0] as ServiceProcess, "whoami");
  await toolAvailable(services[0] as ServiceProcess, "whoami_http");
  await toolAvailable(services[0] as ServiceProcess, "whoami_held");
  gateway = await startGateway({
    ...env,
    ...token,
    TOOLMESH_GATEWAY_JWKS_URL: `${as.url}/idp/jwks`,
    TOOLMESH_GATEWAY_JWT_ISSUER: as.idpIssuer,
    TOOLMESH_GATEWAY_RESOURCE_URL: GATEWAY_AUDIENCE,
    TOOLMESH_GATEWAY_TENANT_CLAIM: "org",
    TOOLMESH_GATEWAY_CONSENT_URL: `${as.url}/consent?audience={audience}&scope={scope}`,
  });
  for (const sub of ["alice", "bob", "carol", "dave", "frank"])
    await admin("consent", { sub, audience: API_AUDIENCE });
}, 150_000);

const afterAllClose: (() => Promise<void>)[] = [];

afterAll(async () => {
  await killAllServices();
  for (const close of afterAllClose) await close();
  await nc?.close();
  as?.process.kill();
  mcpServer?.child.kill();
  await server?.stop();
});

describe("delegated credentials by token exchange", () => {
  it("refuses to start an executor of token-exchange tools without the token endpoint and keys, saying what to set", async () => {
    const what = /token-exchange: set TOOLMESH_SECRET_KEYS and TOOLMESH_TOKEN_URL/;
    await expect(startService("executor", baseEnv, 30_000)).rejects.toThrow(what);
    await expect(
      startService("executor", { ...baseEnv, TOOLMESH_SECRET_KEYS: KEYS }, 30_000),
    ).rejects.toThrow(what);
    // A bridge whose MCP server's tools act as their caller, alike.
    const bridge = { ...baseEnv, TOOLMESH_MCP_DIR: bridgeEnv.TOOLMESH_MCP_DIR ?? "" };
    await expect(startService("mcp-bridge", bridge, 30_000)).rejects.toThrow(what);
  });

  it("gives each caller a token of their own: the API sees two subjects", async () => {
    const [a, b] = await Promise.all([
      login("alice").then((t) => call(t, "whoami")),
      login("bob").then((t) => call(t, "whoami")),
    ]);
    expect([JSON.parse(a.text), JSON.parse(b.text)]).toEqual([
      { sub: "alice", aud: API_AUDIENCE },
      { sub: "bob", aud: API_AUDIENCE },
    ]);
    // An HTTP tool file sends it as Authorization.
    expect(JSON.parse((await call(await login("bob"), "whoami_http")).text)).toEqual({
      sub: "bob",
      aud: API_AUDIENCE,
    });
  });

  it("sends a bridged MCP server each caller's own token on their tools/call, over one session", async () => {
    const [a, b] = await Promise.all([
      login("alice").then((t) => call(t, "api.caller")),
      login("bob").then((t) => call(t, "api.caller")),
    ]);
    expect([a.isError, b.isError]).toEqual([false, false]);
    expect([JSON.parse(a.text), JSON.parse(b.text)]).toEqual([
      { sub: "alice", aud: API_AUDIENCE },
      { sub: "bob", aud: API_AUDIENCE },
    ]);
    // A caller without consent for the API: credential_required, and the server is not called.
    const { apiSaw: before } = await admin<{ apiSaw: string[] }>("issued");
    const never = await call(await login("ivan"), "api.caller");
    expect(never.isError).toBe(true);
    expect(never.text).toContain('no delegation of user "ivan"');
    expect((await admin<{ apiSaw: string[] }>("issued")).apiSaw.length).toBe(before.length);
  });

  it("runs a call approved two hours later with a fresh token, the caller's own long expired", async () => {
    const token = await login("carol");
    const result = call(token, "whoami_held");
    const entry = await held("whoami_held");
    await admin("clock", { advanceMs: 2 * 3600_000 });
    // The caller's token no longer exchanges: only the grant obtained at submission acts now.
    const late = await exchange(
      as.url,
      { id: "toolmesh", secret: CLIENT_SECRET },
      token,
      API_AUDIENCE,
    );
    expect(late).toMatchObject({ error: "invalid_grant" });
    await approve(entry.call_id);
    expect(JSON.parse((await result).text)).toEqual({ sub: "carol", aud: API_AUDIENCE });
  });

  it("ends a call whose consent was revoked, or never given, with credential_required", async () => {
    const result = call(await login("dave"), "whoami_held");
    const entry = await held("whoami_held");
    await admin("revoke", { sub: "dave", audience: API_AUDIENCE });
    await approve(entry.call_id);
    const revoked = await result;
    expect(revoked.isError).toBe(true);
    expect(revoked.text).toContain("invalid_grant");
    const never = await call(await login("erin"), "whoami");
    expect(never.isError).toBe(true);
    expect(never.text).toContain('no delegation of user "erin"');
    const kv = await new Kvm(nc).open(subjects.callsBucket);
    const codes: string[] = [];
    for await (const key of await kv.keys("acme.>")) {
      const record = (await kv.get(key))?.json<{
        tool: string;
        result?: { error?: { code: string }; attempts?: number; content: string };
      }>();
      if (!record?.tool.startsWith("whoami")) continue;
      if (record.result?.error !== undefined && record.result.attempts === 1)
        codes.push(record.result.error.code);
    }
    expect(codes).toEqual([ErrorCode.CredentialRequired, ErrorCode.CredentialRequired]);
  });

  it("asks a 2026-07-28 caller who has not authorized the tool to open the consent page, and runs the call as them once they have", async () => {
    const before = await recordCount();
    const asks: { mode?: string; url?: string; message: string }[] = [];
    const result = await modernCall(await login("grace"), "whoami", { url: {} }, async (ask) => {
      asks.push(ask);
      // The user opens the page (the authorization server's) and authorizes the audience; the
      // first time they accept without having done so, and are asked again.
      const url = new URL(ask.url ?? "");
      if (asks.length === 2)
        await admin("consent", { sub: "grace", audience: url.searchParams.get("audience") });
      return "accept";
    });
    expect(result.isError).toBeFalsy();
    expect(JSON.parse((result.content[0] as { text: string }).text)).toEqual({
      sub: "grace",
      aud: API_AUDIENCE,
    });
    expect(asks).toHaveLength(2);
    for (const ask of asks) {
      expect(ask.mode).toBe("url");
      expect(ask.message).toContain(API_AUDIENCE);
      const url = new URL(ask.url ?? "");
      expect(`${url.origin}${url.pathname}`).toBe(`${as.url}/consent`);
      expect(url.searchParams.get("audience")).toBe(API_AUDIENCE);
      expect(url.searchParams.get("scope")).toBe("api:read");
    }
    // Submitted once, after the consent: one record more.
    expect(await recordCount()).toBe(before + 1);
  });

  it("submits nothing when the caller declines, and asks no client that does not take URLs", async () => {
    const before = await recordCount();
    const token = await login("heidi");
    const declined = await modernCall(token, "whoami", { url: {} }, () =>
      Promise.resolve("decline"),
    );
    expect(declined.isError).toBe(true);
    expect(declined.structuredContent).toMatchObject({ code: ErrorCode.Cancelled });
    expect(await recordCount()).toBe(before);
    // A client with forms only is not asked: the call runs and ends credential_required.
    const formsOnly = await modernCall(token, "whoami", { form: {} }, () => {
      throw new Error("asked a client that does not take URLs");
    });
    expect(formsOnly.isError).toBe(true);
    expect(formsOnly.structuredContent).toMatchObject({ code: ErrorCode.CredentialRequired });
  });

  it("takes a consent's requestState once, from the caller it was issued to", async () => {
    const token = await login("ivan");
    const asked = await rawCall(token, "whoami");
    expect(asked).toMatchObject({ resultType: "input_required" });
    const requestState = asked.requestState as string;
    const inputResponses = { consent: { action: "accept" } };
    // Another user of the same tenant cannot use it.
    const foreign = await rawCall(await login("judy"), "whoami", { requestState, inputResponses });
    expect(foreign).toMatchObject({
      isError: true,
      structuredContent: { code: "invalid_request", details: { request_state: "foreign" } },
    });
    // A retry that answers something else than the consent request is refused; nothing is submitted.
    const unanswered = await rawCall(token, "whoami", { requestState, inputResponses: {} });
    expect(unanswered).toMatchObject({
      isError: true,
      structuredContent: { code: "invalid_request" },
    });
    await admin("consent", { sub: "ivan", audience: API_AUDIENCE });
    const ran = await rawCall(token, "whoami", { requestState, inputResponses });
    expect(ran.isError).toBeFalsy();
    const content = ran.content as { text: string }[];
    expect(JSON.parse(content[0]?.text ?? "")).toEqual({ sub: "ivan", aud: API_AUDIENCE });
    const replayed = await rawCall(token, "whoami", { requestState, inputResponses });
    expect(replayed).toMatchObject({
      isError: true,
      structuredContent: { code: "invalid_request", details: { request_state: "used" } },
    });
  });

  it("asks before creating a task, and the retry creates the task, which runs as the caller", async () => {
    const token = await login("mallory");
    const task = { ttl: 60_000 };
    const asked = await rawCall(token, "whoami", { task });
    expect(asked).toMatchObject({
      resultType: "input_required",
      inputRequests: { consent: { method: "elicitation/create", params: { mode: "url" } } },
    });
    await admin("consent", { sub: "mallory", audience: API_AUDIENCE });
    const created = await rawCall(token, "whoami", {
      task,
      requestState: asked.requestState,
      inputResponses: { consent: { action: "accept" } },
    });
    // The task is read once the mesh stored the call: a quick tool may have completed it by then.
    expect(created).toMatchObject({ resultType: "task" });
    const { taskId, status } = created.task as { taskId: string; status: string };
    expect(["working", "completed"]).toContain(status);
    const done = await eventually("the task completed", async () => {
      const got = await rawRequest(token, "tasks/get", { taskId });
      return got.status === "completed" ? got : undefined;
    });
    const result = done.result as { content: { text: string }[] };
    expect(JSON.parse(result.content[0]?.text ?? "")).toEqual({
      sub: "mallory",
      aud: API_AUDIENCE,
    });
  });

  it("keeps grants sealed while their calls wait and purges them when the calls end", async () => {
    const kv = await new Kvm(nc).open(subjects.userSecretsBucket);
    // A user with no token cached: the authorization server's clock is two hours ahead now.
    const result = call(await login("frank"), "whoami_held");
    const entry = await held("whoami_held");
    const key = subjects.delegationGrantKey("acme", "frank", API_AUDIENCE, entry.call_id);
    const sealed = (await kv.get(key))?.string() ?? "";
    expect(JSON.parse(sealed)).toMatchObject({ v: 1, kid: "k1" });
    const { issued } = await admin<{ issued: string[] }>("issued");
    for (const t of issued) expect(sealed.includes(t)).toBe(false);
    await approve(entry.call_id);
    expect(JSON.parse((await result).text)).toMatchObject({ sub: "frank" });
    await eventually("grants purged", async () => {
      const left: string[] = [];
      for await (const k of await kv.keys("*.*.*.grant.*")) {
        const e = await kv.get(k);
        if (e?.operation === "PUT") left.push(k);
      }
      return left.length === 0 ? true : undefined;
    });
  });

  it("purges the grant of a call that ended before it reached an executor, at the next sweep, and keeps a waiting call's", async () => {
    const kv = await new Kvm(nc).open(subjects.userSecretsBucket);
    const grant = async (user: string, id: string) =>
      (await kv.get(subjects.delegationGrantKey("acme", user, API_AUDIENCE, id)))?.operation;
    for (const sub of ["judy", "kim"]) await admin("consent", { sub, audience: API_AUDIENCE });
    const waiting = call(await login("judy"), "whoami_held");
    const kept = await held("whoami_held");
    const denied = call(await login("kim"), "whoami_held");
    const refused = await eventually("kim's call waiting", async () => {
      const out = await runCli(["--tenant", "acme", "approvals", "list", "--json"], {
        NATS_URL: server.url,
      });
      return (JSON.parse(out.stdout) as ApprovalEntry[]).find((e) => e.call_id !== kept.call_id);
    });
    const no = await runCli(["--tenant", "acme", "approvals", "deny", refused.call_id], {
      NATS_URL: server.url,
    });
    expect(no.code).toBe(0);
    expect((await denied).isError).toBe(true);
    // No executor ran the denied call: its grant is still sealed in the bucket.
    expect(await grant("kim", refused.call_id)).toBe("PUT");
    // A replica sweeps when it starts: the denied call's grant goes, the waiting call's stays.
    services.push(await startService("executor", executorEnv, 60_000));
    await eventually("the denied call's grant purged", async () =>
      (await grant("kim", refused.call_id)) === "PURGE" ? true : undefined,
    );
    expect(await grant("judy", kept.call_id)).toBe("PUT");
    await approve(kept.call_id);
    expect(JSON.parse((await waiting).text)).toMatchObject({ sub: "judy" });
  });

  it("lets a replica whose host clock is an hour ahead use the token another replica cached: expiry is on the server's clock", async () => {
    // A user with no token cached: the authorization server's clock is two hours ahead now.
    await admin("consent", { sub: "heidi", audience: API_AUDIENCE });
    const token = await login("heidi");
    expect(JSON.parse((await call(token, "whoami")).text)).toMatchObject({ sub: "heidi" });
    const { apiSaw: before } = await admin<{ apiSaw: string[] }>("issued");
    // Only a replica on a host whose clock runs an hour ahead serves the tool now.
    const preload = join(await mkdtemp(join(tmpdir(), "toolmesh-skew-")), "skew.mjs");
    await writeFile(preload, "const now = Date.now; Date.now = () => now() + 3_600_000;\n");
    const normal = services[1] as ServiceProcess;
    const ahead = await startService(
      "executor",
      { ...executorEnv, NODE_OPTIONS: `--import=${preload}` },
      60_000,
    );
    services.push(ahead);
    await normal.stop();
    await toolAvailable(services[0] as ServiceProcess, "whoami");
    expect(JSON.parse((await call(token, "whoami")).text)).toMatchObject({ sub: "heidi" });
    // The token cached a moment ago has most of its ten minutes left: the API sees it again.
    const { apiSaw: after } = await admin<{ apiSaw: string[] }>("issued");
    expect(after.length).toBe(before.length + 1);
    expect(after.at(-1)).toBe(before.at(-1));
  });

  it("waits for an executor of the tool to take the grant while none runs, then runs the call as its caller", async () => {
    const executors = services.filter(
      (s) =>
        s.child.exitCode === null &&
        s.child.signalCode === null &&
        s.lines.some((l) => l.msg === "executor started"),
    );
    expect(executors.length).toBeGreaterThan(0);
    for (const executor of executors) await executor.stop();
    // A user with no token cached: the authorization server's clock is two hours ahead now.
    await admin("consent", { sub: "lena", audience: API_AUDIENCE });
    const result = call(await login("lena"), "whoami");
    // The gateway holds the call while nobody answers the deposit (a restart, a scale from zero).
    await gateway.process.waitForLog(
      (l) => l.msg === "no executor took the delegation yet; waiting",
    );
    services.push(await startService("executor", executorEnv, 60_000));
    expect(JSON.parse((await result).text)).toEqual({ sub: "lena", aud: API_AUDIENCE });
  });

  it("lets no token, grant or caller's token reach a record, a stored message or a log line", async () => {
    const { issued, apiSaw } = await admin<{ issued: string[]; apiSaw: string[] }>("issued");
    const secrets = [...new Set([...issued, ...apiSaw])];
    expect(secrets.length).toBeGreaterThan(10);
    // The grant crosses once, by core request, to the executors that seal it: never on a stream.
    const deposit = subjects.delegationDeposit();
    const jsm = await jetstreamManager(nc);
    for await (const stream of jsm.streams.list())
      for (const subject of stream.config.subjects ?? [])
        expect(
          subject === deposit || subject === ">" || subject.startsWith("toolmesh.v1.delegation"),
        ).toBe(false);
    expect(seen.some((m) => m.subject === deposit)).toBe(true);
    const logs = [...services, gateway.process].map((s) => JSON.stringify(s.lines) + s.stderr());
    const texts = [...seen.filter((m) => m.subject !== deposit).map((m) => m.text), ...logs];
    for (const secret of secrets)
      for (const text of texts) expect(text.includes(secret)).toBe(false);
  });
});
