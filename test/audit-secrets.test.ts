import { copyFile, mkdtemp } from "node:fs/promises";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { SignJWT, exportJWK, generateKeyPair } from "jose";
import type { JWK } from "jose";
import { createSubjects } from "@toolmesh/protocol";
import { readTrail } from "@toolmesh/audit";
import { KEYS, mcpClient, startGateway, writeKeysFile } from "./helpers/gateway.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { until } from "./helpers/eventually.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// No secret in the trail: calls made through the gateway with a static API key and with a JWT,
// of a tool whose executor injects a preset secret, with the tenant recording its arguments in
// full. Every stored event of the tenant is then searched for each secret.

const ISSUER = "https://auth.example.test/";
const AUDIENCE = "https://tools.example.test/mcp";
const PRESET = "preset-secret-value"; // the `token` preset of the `inspect` fixture

let server: NatsServerHandle;
let jwksServer: Server;
let nc: NatsConnection;
let env: Record<string, string>;
let gatewayUrl: string;
let jwt: string;

beforeAll(async () => {
  server = await startNatsServer();
  const pair = await generateKeyPair("ES256");
  const jwk: JWK = { ...(await exportJWK(pair.publicKey)), kid: "k1", alg: "ES256", use: "sig" };
  jwksServer = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ keys: [jwk] }));
  });
  await new Promise<void>((resolve) => jwksServer.listen(0, "127.0.0.1", resolve));
  const jwksUrl = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/jwks.json`;
  jwt = await new SignJWT({ org: "acme" })
    .setProtectedHeader({ alg: "ES256", kid: "k1" })
    .setIssuer(ISSUER)
    .setAudience(AUDIENCE)
    .setSubject("user-1")
    .setIssuedAt()
    .setExpirationTime("10m")
    .sign(pair.privateKey);
  const tools = await mkdtemp(join(tmpdir(), "toolmesh-audit-secrets-"));
  await copyFile(join(fixtureTools("tools-a"), "inspect.js"), join(tools, "inspect.js"));
  const keys = await writeKeysFile();
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_AUDIT: "required",
    TOOLMESH_AUDIT_ARGUMENTS: JSON.stringify({ acme: "full" }),
  };
  expect((await runCli(["setup", "--tenants", "acme"], env)).code).toBe(0);
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, "inspect");
  const gateway = await startGateway({
    ...env,
    ...keys.env,
    TOOLMESH_GATEWAY_KEYS_FILE: keys.file,
    TOOLMESH_GATEWAY_JWKS_URL: jwksUrl,
    TOOLMESH_GATEWAY_JWT_ISSUER: ISSUER,
    TOOLMESH_GATEWAY_RESOURCE_URL: AUDIENCE,
    TOOLMESH_GATEWAY_TENANT_CLAIM: "org",
  });
  gatewayUrl = gateway.url;
  nc = await connect({ servers: server.url });
}, 150_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await new Promise((resolve) => jwksServer?.close(resolve));
  await server?.stop();
});

/** Calls `inspect` through the gateway with `bearer`; the text of its result. */
async function callWith(bearer: string, query: string): Promise<string> {
  const client = await mcpClient(gatewayUrl, bearer);
  try {
    const result = await client.callTool({ name: "inspect", arguments: { query } });
    return (result.content as { text: string }[])[0]?.text ?? "";
  } finally {
    await client.close();
  }
}

describe("the trail of calls made with a gateway key, a JWT and a preset secret", () => {
  it("holds none of them, in any event", async () => {
    // The tool echoes what it received: the preset reached it, so it was in play.
    expect(await callWith(KEYS.acme, "by-key")).toContain(PRESET);
    expect(await callWith(jwt, "by-jwt")).toContain(PRESET);

    const subjects = createSubjects();
    let raw: string[] = [];
    await until("both calls' trails end", async () => {
      raw = [];
      for await (const { record } of readTrail(nc, subjects, "acme"))
        raw.push(JSON.stringify(record));
      return raw.filter((r) => r.includes('"call.ended"')).length >= 2;
    });
    // The events are there, arguments in full: the search below has something to search.
    const all = raw.join("\n");
    expect(all).toContain('"query":"by-key"');
    expect(all).toContain('"query":"by-jwt"');
    for (const type of ["call.admitted", "call.ended"])
      expect(raw.filter((r) => r.includes(`"type":"${type}"`)).length, type).toBe(2);

    const [header, payload, signature] = jwt.split(".") as [string, string, string];
    const secrets = { preset: PRESET, key: KEYS.acme, jwt, header, payload, signature };
    for (const [name, secret] of Object.entries(secrets))
      for (const event of raw) expect(event.includes(secret), `${name} in ${event}`).toBe(false);

    // And what the CLI exports is the same stored events.
    const exported = await runCli(["audit", "export", "--tenant", "acme", "--since", "1h"], env);
    expect(exported.code).toBe(0);
    expect(exported.stdout.split("\n").filter(Boolean)).toHaveLength(raw.length);
    for (const [name, secret] of Object.entries(secrets))
      expect(exported.stdout.includes(secret), name).toBe(false);
  });
});
