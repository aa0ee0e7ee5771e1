import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import type { CryptoKey, JWK } from "jose";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { ErrorCode, createSubjects } from "@toolmesh/protocol";
import { runCliWithInput, runCli } from "./helpers/cli.js";
import { gatewayAgents, mcpClient, startGateway } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startTestMcpServer } from "./helpers/mcp-test-server.js";
import type { TestMcpServer } from "./helpers/mcp-test-server.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// A tool that acts with the calling user's own secret: the user (or an operator for them)
// stores it with `toolmesh secrets set`, sealed; the executor opens it for that user's calls
// only, and sends it to a real HTTP API that knows whose key it is.

const ISSUER = "https://auth.example.test/";
const AUDIENCE = "https://tools.example.test/mcp";
const ALICE_SECRET = `alice-crm-${randomBytes(8).toString("hex")}`;
const BOB_SECRET = `bob-crm-${randomBytes(8).toString("hex")}`;
const KEYS = `k1:${randomBytes(32).toString("base64")}`;

// Calls the CRM with the user's key; the CRM answers whose key it is.
const CRM_TOOL = (url: string) => `export default {
  name: "crm_lookup",
  description: "Looks the caller up in the CRM with their own key.",
  parameters: { type: "object", properties: {} },
  credentials: { type: "user-secret" },
  async handler(_args, ctx) {
    const res = await fetch(${JSON.stringify(url)}, { headers: { authorization: "Bearer " + ctx.credential } });
    if (!res.ok) throw Object.assign(new Error("crm said " + res.status), { retryable: false });
    return await res.json();
  },
};
`;

let server: NatsServerHandle;
let jwksServer: Server;
let crm: Server;
let mcpServer: TestMcpServer;
let signingKey: CryptoKey;
let gateway: { url: string; process: ServiceProcess };
let services: ServiceProcess[];
let spy: NatsConnection;
let cliEnv: Record<string, string>;
const seen: string[] = [];
const tokens: string[] = [];

async function token(sub: string): Promise<string> {
  const jwt = await new SignJWT({ org: "acme", scope: "tools:call" })
    .setProtectedHeader({ alg: "ES256", kid: "k1" })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime("5m")
    .sign(signingKey);
  tokens.push(jwt);
  return jwt;
}

async function lookup(
  user: string,
  tool = "crm_lookup",
): Promise<{ text: string; isError: boolean }> {
  const c = await mcpClient(gateway.url, await token(user));
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

/** Stores `secret` as user `subject`'s for `tool` with the CLI, as an operator does. */
async function storeSecret(subject: string, tool: string, secret: string): Promise<void> {
  const set = await runCliWithInput(
    ["secrets", "set", "--tenant", "acme", "--subject", subject, "--tool", tool],
    cliEnv,
    secret,
  );
  expect(set.code).toBe(0);
}

async function listen(s: Server): Promise<string> {
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

beforeAll(async () => {
  server = await startNatsServer();
  spy = await connect({ servers: server.url });
  spy.subscribe(">", {
    callback: (_err, msg) => {
      const headers = msg.headers;
      const values = headers === undefined ? [] : headers.keys().map((k) => headers.get(k));
      seen.push(`${msg.subject} ${values.join(" ")} ${msg.string()}`);
    },
  });
  const pair = await generateKeyPair("ES256");
  signingKey = pair.privateKey;
  const jwk: JWK = { ...(await exportJWK(pair.publicKey)), kid: "k1", alg: "ES256", use: "sig" };
  jwksServer = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  const owners = new Map([
    [`Bearer ${ALICE_SECRET}`, "alice"],
    [`Bearer ${BOB_SECRET}`, "bob"],
    [`Token ${ALICE_SECRET}`, "alice, by the Token scheme"],
  ]);
  crm = createServer((req, res) => {
    const who = owners.get(req.headers.authorization ?? "");
    res.writeHead(who === undefined ? 401 : 200, { "content-type": "application/json" });
    res.end(JSON.stringify(who === undefined ? { error: "unknown key" } : { account_of: who }));
  });
  const jwksUrl = `${await listen(jwksServer)}/jwks.json`;
  const crmUrl = `${await listen(crm)}/me`;
  const tools = await mkdtemp(join(tmpdir(), "toolmesh-user-secrets-"));
  await writeFile(join(tools, "crm.js"), CRM_TOOL(crmUrl));
  // HTTP tool files that send the caller's secret as Authorization: Bearer, and a named scheme.
  const native = await mkdtemp(join(tmpdir(), "toolmesh-user-secrets-http-"));
  await writeFile(
    join(native, "crm_http.yaml"),
    `name: crm_http\ndescription: The caller in the CRM.\napi_url: ${crmUrl}\ncredentials:\n  type: user-secret\n`,
  );
  await writeFile(
    join(native, "crm_token.yaml"),
    `name: crm_token\ndescription: The caller in the CRM.\napi_url: ${crmUrl}\ncredentials:\n  type: user-secret\n  scheme: Token\n`,
  );
  // An OpenAPI document whose every operation acts as the caller: tool crm.me.
  await writeFile(
    join(native, "crm-doc.json"),
    JSON.stringify({
      openapi: "3.0.3",
      info: { title: "CRM", version: "1" },
      servers: [{ url: new URL(crmUrl).origin }],
      paths: { "/me": { get: { operationId: "me", responses: { 200: { description: "ok" } } } } },
    }),
  );
  await writeFile(
    join(native, "crm.openapi.yaml"),
    "spec: crm-doc.json\ncredentials:\n  type: user-secret\n",
  );
  // A bridged MCP server over HTTP whose tool asks the CRM with its request's Authorization.
  mcpServer = await startTestMcpServer("--http", { MCP_TEST_CALLER_API: crmUrl });
  const mcp = await mkdtemp(join(tmpdir(), "toolmesh-user-secrets-mcp-"));
  await writeFile(
    join(mcp, "crm_mcp.yaml"),
    `name: crm_mcp\ntransport: http\nurl: ${mcpServer.url}\ncredentials:\n  type: user-secret\n`,
  );
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_NATIVE_TOOLS_DIR: native,
    TOOLMESH_CONFIG_DIR: await gatewayAgents(),
  };
  cliEnv = { NATS_URL: server.url, TOOLMESH_SECRET_KEYS: KEYS };
  // The bucket exists before the executor opens it: an operator's first `secrets set`.
  const first = await runCliWithInput(
    ["secrets", "set", "--tenant", "acme", "--subject", "alice", "--tool", "crm_lookup"],
    cliEnv,
    `${ALICE_SECRET}\n`,
  );
  expect(first).toMatchObject({ code: 0, stderr: "" });
  services = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", { ...env, TOOLMESH_SECRET_KEYS: KEYS }, 60_000),
    startService(
      "mcp-bridge",
      { ...env, TOOLMESH_SECRET_KEYS: KEYS, TOOLMESH_MCP_DIR: mcp },
      60_000,
    ),
  ]);
  await toolAvailable(services[0] as ServiceProcess, "crm_lookup");
  gateway = await startGateway({
    ...env,
    TOOLMESH_GATEWAY_JWKS_URL: jwksUrl,
    TOOLMESH_GATEWAY_JWT_ISSUER: ISSUER,
    TOOLMESH_GATEWAY_RESOURCE_URL: AUDIENCE,
    TOOLMESH_GATEWAY_TENANT_CLAIM: "org",
  });
}, 150_000);

afterAll(async () => {
  await killAllServices();
  await spy?.close();
  await new Promise((resolve) => jwksServer?.close(resolve));
  await new Promise((resolve) => crm?.close(resolve));
  mcpServer?.child.kill();
  await server?.stop();
});

describe("user secrets", () => {
  it("acts with the calling user's own secret; a user without one gets credential_required", async () => {
    expect(JSON.parse((await lookup("alice")).text)).toEqual({ account_of: "alice" });
    const bob = await lookup("bob");
    expect(bob.isError).toBe(true);
    expect(bob.text).toContain('no secret of user "bob" for tool "crm_lookup"');
    await storeSecret("bob", "crm_lookup", BOB_SECRET);
    const [a, b] = await Promise.all([lookup("alice"), lookup("bob")]);
    expect([JSON.parse(a.text), JSON.parse(b.text)]).toEqual([
      { account_of: "alice" },
      { account_of: "bob" },
    ]);
  });

  it("sends the caller's secret as an HTTP or OpenAPI tool's Authorization, in the scheme named", async () => {
    for (const tool of ["crm_http", "crm_token", "crm.me"])
      await storeSecret("alice", tool, ALICE_SECRET);
    await toolAvailable(services[0] as ServiceProcess, "crm_token");
    expect(JSON.parse((await lookup("alice", "crm_http")).text)).toEqual({ account_of: "alice" });
    expect(JSON.parse((await lookup("alice", "crm_token")).text)).toEqual({
      account_of: "alice, by the Token scheme",
    });
    await toolAvailable(services[0] as ServiceProcess, "crm.me");
    expect(JSON.parse((await lookup("alice", "crm.me")).text)).toEqual({ account_of: "alice" });
    // Bob stored a secret for crm_lookup only: not sent to another tool.
    const bob = await lookup("bob", "crm_http");
    expect(bob.isError).toBe(true);
    expect(bob.text).toContain('no secret of user "bob" for tool "crm_http"');
  });

  it("sends a bridged MCP server the caller's secret on their tools/call", async () => {
    await toolAvailable(services[0] as ServiceProcess, "crm_mcp.caller");
    const before = await lookup("bob", "crm_mcp.caller");
    expect(before.isError).toBe(true);
    expect(before.text).toContain('no secret of user "bob" for tool "crm_mcp.caller"');
    await storeSecret("bob", "crm_mcp.caller", BOB_SECRET);
    expect(JSON.parse((await lookup("bob", "crm_mcp.caller")).text)).toEqual({
      account_of: "bob",
    });
  });

  it("ends the call with the typed error, not a retry", async () => {
    const nc = await connect({ servers: server.url });
    try {
      const kv = await new Kvm(nc).open(createSubjects().callsBucket);
      const c = await lookup("carol");
      expect(c.isError).toBe(true);
      let code: string | undefined;
      let attempts: number | undefined;
      for await (const key of await kv.keys("acme.>")) {
        const record = (await kv.get(key))?.json<{
          result?: { error?: { code: string }; attempts?: number; content: string };
        }>();
        if (record?.result?.content.includes('"carol"') === true) {
          code = record.result.error?.code;
          attempts = record.result.attempts;
        }
      }
      expect(code).toBe(ErrorCode.CredentialRequired);
      expect(attempts).toBe(1);
    } finally {
      await nc.close();
    }
  });

  it("lists names only, removes, and stores nothing in the clear", async () => {
    const list = await runCli(
      ["secrets", "list", "--tenant", "acme", "--subject", "alice", "--json"],
      cliEnv,
    );
    expect(JSON.parse(list.stdout)).toEqual({
      tools: ["crm.me", "crm_http", "crm_lookup", "crm_token"],
    });
    expect(list.stdout).not.toContain(ALICE_SECRET);
    const nc = await connect({ servers: server.url });
    try {
      const kv = await new Kvm(nc).open(createSubjects().userSecretsBucket);
      const stored =
        (await kv.get(createSubjects().userSecretKey("acme", "alice", "crm_lookup")))?.string() ??
        "";
      expect(JSON.parse(stored)).toMatchObject({ v: 1, kid: "k1" });
      expect(stored).not.toContain(ALICE_SECRET);
      // Sealed for alice's key: copied under bob's, it does not open.
      await kv.put(createSubjects().userSecretKey("acme", "bob", "crm_lookup"), stored);
      const moved = await lookup("bob");
      expect(moved.isError).toBe(true);
      expect(moved.text).toContain("cannot be opened");
    } finally {
      await nc.close();
    }
    const rm = await runCli(
      ["secrets", "rm", "--tenant", "acme", "--subject", "alice", "--tool", "crm_lookup"],
      cliEnv,
    );
    expect(rm).toMatchObject({ code: 0, stdout: "removed\n" });
    expect((await lookup("alice")).text).toContain('no secret of user "alice"');
  });

  it("never lets a secret or a token reach a message or a log line", async () => {
    expect(seen.some((m) => m.includes("crm_lookup"))).toBe(true);
    const logs = [...services, gateway.process].map((s) => JSON.stringify(s.lines) + s.stderr());
    for (const secret of [ALICE_SECRET, BOB_SECRET, ...tokens])
      for (const text of [...seen, ...logs]) expect(text.includes(secret)).toBe(false);
  });
});
