import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import type { CryptoKey, JWK } from "jose";
import { gatewayAgents, gatewayTools, mcpClient, startGateway } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The gateway as an OAuth 2.1 resource server: JWTs checked against a JWKS served by a real
// local HTTP server, the way an authorization server publishes its keys.

const ISSUER = "https://auth.example.test/";
const AUDIENCE = "https://tools.example.test/mcp";

let server: NatsServerHandle;
let jwksServer: Server;
let signingKey: CryptoKey;
let strangerKey: CryptoKey;
let gateway: { process: ServiceProcess; url: string; port: number };

async function token(
  claims: Record<string, unknown>,
  options: {
    key?: CryptoKey;
    issuer?: string;
    audience?: string;
    expiresIn?: string | number;
  } = {},
): Promise<string> {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: "ES256", kid: options.key === undefined ? "k1" : "k2" })
    .setIssuer(options.issuer ?? ISSUER)
    .setAudience(options.audience ?? AUDIENCE)
    .setSubject("user-1")
    .setIssuedAt()
    .setExpirationTime(options.expiresIn ?? "5m")
    .sign(options.key ?? signingKey);
}

const post = (authorization: string | undefined) =>
  fetch(gateway.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      ...(authorization === undefined ? {} : { authorization }),
    },
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 1,
      method: "initialize",
      params: {
        protocolVersion: "2025-06-18",
        capabilities: {},
        clientInfo: { name: "raw", version: "1" },
      },
    }),
  });

beforeAll(async () => {
  server = await startNatsServer();
  const pair = await generateKeyPair("ES256");
  signingKey = pair.privateKey;
  strangerKey = (await generateKeyPair("ES256")).privateKey;
  const jwk: JWK = { ...(await exportJWK(pair.publicKey)), kid: "k1", alg: "ES256", use: "sig" };
  jwksServer = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((resolve) => jwksServer.listen(0, "127.0.0.1", resolve));
  const jwksUrl = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/jwks.json`;
  const [tools, configs] = await Promise.all([gatewayTools(), gatewayAgents()]);
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo");
  gateway = await startGateway({
    ...env,
    TOOLMESH_GATEWAY_JWKS_URL: jwksUrl,
    TOOLMESH_GATEWAY_JWT_ISSUER: ISSUER,
    TOOLMESH_GATEWAY_RESOURCE_URL: AUDIENCE,
    TOOLMESH_GATEWAY_TENANT_CLAIM: "org",
    TOOLMESH_GATEWAY_REQUIRED_SCOPES: "tools:call",
    TOOLMESH_GATEWAY_AUTHORIZATION_SERVERS: ISSUER,
  });
}, 150_000);

afterAll(async () => {
  await killAllServices();
  await new Promise((resolve) => jwksServer?.close(resolve));
  await server?.stop();
});

describe("JWT bearer tokens", () => {
  it("lets a valid token in as the tenant its claim names, narrowed to its agents", async () => {
    const jwt = await token({ org: "acme", scope: "tools:call other", agents: ["writer"] });
    const c = await mcpClient(gateway.url, jwt);
    const names = (await c.listTools()).tools.map((t) => t.name);
    expect(names).toContain("echo");
    expect(names).not.toContain("optimize_structure");
    const result = await c.callTool({
      name: "echo",
      arguments: { text: "signed" },
    });
    expect((result.content[0] as { text: string }).text).toBe("signed");
    await c.close();
  });

  it("answers 401 with the resource metadata to a request with no token", async () => {
    const res = await post(undefined);
    expect(res.status).toBe(401);
    const challenge = res.headers.get("www-authenticate") ?? "";
    expect(challenge).toContain(
      'resource_metadata="https://tools.example.test/.well-known/oauth-protected-resource"',
    );
    expect(challenge).toContain('scope="tools:call"');
  });

  it("serves the protected-resource metadata", async () => {
    const res = await fetch(
      `http://127.0.0.1:${gateway.port}/.well-known/oauth-protected-resource`,
    );
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({
      resource: AUDIENCE,
      authorization_servers: [ISSUER],
      bearer_methods_supported: ["header"],
      scopes_supported: ["tools:call"],
    });
  });

  it.each([
    [
      "an expired token",
      () => token({ org: "acme", scope: "tools:call" }, { expiresIn: "-1m" }),
      /expired/,
    ],
    [
      "a token for another audience",
      () => token({ org: "acme", scope: "tools:call" }, { audience: "https://elsewhere.test/mcp" }),
      /aud/,
    ],
    [
      "a token from another issuer",
      () => token({ org: "acme", scope: "tools:call" }, { issuer: "https://evil.test/" }),
      /iss/,
    ],
    [
      "a token signed by a key not in the JWKS",
      () => token({ org: "acme", scope: "tools:call" }, { key: strangerKey }),
      /key|signature/,
    ],
    ["a token with no tenant claim", () => token({ scope: "tools:call" }), /org/],
  ])("answers 401 invalid_token to %s", async (_name, make, reason) => {
    const res = await post(`Bearer ${await make()}`);
    expect(res.status).toBe(401);
    const challenge = res.headers.get("www-authenticate") ?? "";
    expect(challenge).toContain('error="invalid_token"');
    expect(challenge).toMatch(reason);
  });

  it("answers 403 insufficient_scope to a token without the required scope", async () => {
    const res = await post(`Bearer ${await token({ org: "acme", scope: "tools:read" })}`);
    expect(res.status).toBe(403);
    expect(res.headers.get("www-authenticate")).toContain('error="insufficient_scope"');
  });

  it("refuses an unsigned token (alg none)", async () => {
    const encode = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
    const unsigned = `${encode({ alg: "none" })}.${encode({
      org: "acme",
      scope: "tools:call",
      iss: ISSUER,
      aud: AUDIENCE,
      exp: Math.floor(Date.now() / 1000) + 300,
    })}.`;
    const res = await post(`Bearer ${unsigned}`);
    expect(res.status).toBe(401);
  });
});
