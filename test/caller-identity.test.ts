import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import type { CryptoKey, JWK } from "jose";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { ToolmeshClient } from "@toolmesh/client";
import { ErrorCode, GATEWAY_KEY_ISSUER } from "@toolmesh/protocol";
import { keyDigest } from "@toolmesh/gateway";
import { gatewayAgents, gatewayTools, mcpClient, startGateway } from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// The caller's verified identity travels on the call to the tool: from a gateway JWT (with its
// actor chain) or API key entry, or from a tenant's own frontend for its own users only. The
// inbound credential itself reaches no message and no log line of the run.

const ISSUER = "https://auth.example.test/";
const AUDIENCE = "https://tools.example.test/mcp";
const SUBJECT_KEY = "key-acme-service-desk-0123456789";

// Answers with the identity its context holds.
const WHOAMI = `export default {
  name: "whoami",
  description: "Returns who the call acts for.",
  parameters: { type: "object", properties: {} },
  handler(_args, ctx) { return { identity: ctx.identity ?? null }; },
};
`;

let server: NatsServerHandle;
let jwksServer: Server;
let signingKey: CryptoKey;
let gateway: { process: ServiceProcess; url: string; port: number };
let services: ServiceProcess[];
let spy: NatsConnection;
const seen: string[] = [];
const secretsUsed: string[] = [SUBJECT_KEY];

async function token(sub: string, claims: Record<string, unknown> = {}): Promise<string> {
  const jwt = await new SignJWT({ org: "acme", scope: "tools:call", ...claims })
    .setProtectedHeader({ alg: "ES256", kid: "k1" })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime("5m")
    .sign(signingKey);
  secretsUsed.push(jwt);
  return jwt;
}

async function whoami(bearer: string): Promise<unknown> {
  const c = await mcpClient(gateway.url, bearer);
  try {
    const result = await c.callTool({ name: "whoami", arguments: {} });
    expect(result.isError ?? false).toBe(false);
    return (JSON.parse((result.content[0] as { text: string }).text) as { identity: unknown })
      .identity;
  } finally {
    await c.close();
  }
}

beforeAll(async () => {
  server = await startNatsServer();
  // Everything published in the run, payload and headers, to search for credentials afterwards.
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
  await new Promise<void>((resolve) => jwksServer.listen(0, "127.0.0.1", resolve));
  const jwksUrl = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/jwks.json`;
  const [tools, configs] = await Promise.all([gatewayTools(), gatewayAgents()]);
  await writeFile(join(tools, "whoami.js"), WHOAMI);
  const keysDir = await mkdtemp(join(tmpdir(), "toolmesh-identity-keys-"));
  const keysFile = join(keysDir, "keys.yaml");
  await writeFile(
    keysFile,
    [
      "keys:",
      `  - sha256: ${keyDigest(SUBJECT_KEY)}`,
      "    tenant: acme",
      "    name: service-desk",
      "    subject: service-desk@acme",
      "",
    ].join("\n"),
  );
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  services = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
  ]);
  await toolAvailable(services[0] as ServiceProcess, "whoami");
  gateway = await startGateway({
    ...env,
    TOOLMESH_GATEWAY_JWKS_URL: jwksUrl,
    TOOLMESH_GATEWAY_JWT_ISSUER: ISSUER,
    TOOLMESH_GATEWAY_RESOURCE_URL: AUDIENCE,
    TOOLMESH_GATEWAY_TENANT_CLAIM: "org",
    TOOLMESH_GATEWAY_REQUIRED_SCOPES: "tools:call",
    TOOLMESH_GATEWAY_KEYS_FILE: keysFile,
  });
}, 150_000);

afterAll(async () => {
  await killAllServices();
  await spy?.close();
  await new Promise((resolve) => jwksServer?.close(resolve));
  await server?.stop();
});

describe("identity on the call", () => {
  it("hands the tool the JWT's issuer, subject, tenant and actor chain", async () => {
    const jwt = await token("alice", {
      act: { sub: "agent-runner", iss: "https://agents.example.test/", act: { sub: "scheduler" } },
    });
    expect(await whoami(jwt)).toEqual({
      issuer: ISSUER,
      subject: "alice",
      tenant: "acme",
      actor: [
        { subject: "agent-runner", issuer: "https://agents.example.test/" },
        { subject: "scheduler" },
      ],
    });
  });

  it("two users calling the same tool are two subjects", async () => {
    const [a, b] = await Promise.all([token("alice").then(whoami), token("bob").then(whoami)]);
    expect((a as { subject: string }).subject).toBe("alice");
    expect((b as { subject: string }).subject).toBe("bob");
  });

  it("takes the subject an API key entry names", async () => {
    expect(await whoami(SUBJECT_KEY)).toEqual({
      issuer: GATEWAY_KEY_ISSUER,
      subject: "service-desk@acme",
      tenant: "acme",
    });
  });

  it("lets a frontend state its own tenant's users and refuses another tenant's", async () => {
    const nc = await connect({ servers: server.url });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 });
    const session = client.session("identity-frontend");
    try {
      const own = await session.submit(
        { id: "own", name: "whoami", arguments: {} },
        { identity: { issuer: "https://idp.acme.test/", subject: "carol", tenant: "acme" } },
      ).result;
      expect(own.error).toBeUndefined();
      expect(JSON.parse(own.content)).toEqual({
        identity: { issuer: "https://idp.acme.test/", subject: "carol", tenant: "acme" },
      });
      const foreign = await session.submit(
        { id: "foreign", name: "whoami", arguments: {} },
        { identity: { issuer: "https://idp.globex.test/", subject: "dave", tenant: "globex" } },
      ).result;
      expect(foreign.error?.code).toBe(ErrorCode.PermissionDenied);
      expect(foreign.content).toContain("own tenant's users");
    } finally {
      session.close();
      await nc.close();
    }
  });

  it("refuses an identity carrying anything but who the caller is", async () => {
    const nc = await connect({ servers: server.url });
    try {
      const subjects = new ToolmeshClient(nc, { tenant: "acme" }).subjects;
      const reply = await nc.request(
        subjects.resolveRpc("acme"),
        JSON.stringify({
          tool_call: { id: "smuggle", function: { name: "whoami", arguments: "{}" } },
          session_id: "s",
          identity: { issuer: "i", subject: "s", tenant: "acme", token: "ey.secret.x" },
        }),
        { timeout: 10_000 },
      );
      const answer = reply.json<{ ok: boolean; error?: { code: string; message: string } }>();
      expect(answer.ok).toBe(false);
      expect(answer.error?.code).toBe(ErrorCode.InvalidRequest);
      expect(JSON.stringify(answer.error)).toContain("identity");
    } finally {
      await nc.close();
    }
  });

  it("never lets the inbound credential reach a message or a log line", async () => {
    expect(secretsUsed.length).toBeGreaterThan(3);
    // The spy saw the calls themselves: the search covers what the run published.
    expect(seen.some((m) => m.includes('"subject":"alice"'))).toBe(true);
    const logs = [...services, gateway.process].map((s) => JSON.stringify(s.lines) + s.stderr());
    for (const secret of secretsUsed) {
      for (const text of [...seen, ...logs]) expect(text.includes(secret)).toBe(false);
    }
  });
});
