// Rotation without restarts: a role's client certificate renewed in place (as cert-manager renews
// a Secret mounted in a pod) is presented at the next reconnection, and the gateway's keys file
// is read again when it changes. The server maps client certificates to users
// (`verify_and_map`): when it stops accepting the old certificate the running services cannot
// reconnect — their /healthz turns red after TOOLMESH_LIVENESS_DISCONNECTED_MS — until the files
// are replaced, and then they reconnect with the new certificate, with no restart.
import { copyFile, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { keyDigest } from "@toolmesh/gateway";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { gatewayTools, mcpClient, startGateway } from "./helpers/gateway.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { startNatsServer } from "./helpers/nats-server.js";
import { createTestPki, issueClientCertificate } from "./helpers/tls.js";
import type { TestPki } from "./helpers/tls.js";

const OLD_KEY = "key-before-rotation-0123456789";
const NEW_KEY = "key-after-rotation-0123456789";

let pki: TestPki;
let server: NatsServerHandle;
let roleDir: string;
let keysDir: string;
let renewed: { cert: string; key: string };
let resolver: ServiceProcess;
let executor: ServiceProcess;
let gateway: { process: ServiceProcess; url: string; port: number };

/** The server's configuration accepting the client certificates of `subjects` only. */
const serverConfig = (...subjects: string[]): string =>
  [
    // JetStream in the file: a reload of a file without it restarts JetStream (NATS-NOTES).
    `jetstream { store_dir: ${JSON.stringify(join(roleDir, "js"))} }`,
    "tls {",
    `  cert_file: "${pki.serverCert}"`,
    `  key_file: "${pki.serverKey}"`,
    `  ca_file: "${pki.caFile}"`,
    "  verify_and_map: true",
    "}",
    `authorization { users: [${subjects.map((s) => `{user: "CN=${s}"}`).join(", ")}] }`,
  ].join("\n");

/** Replaces `file` as a Secret volume does: the new content appears at once, whole. */
async function replace(file: string, from: string): Promise<void> {
  await copyFile(from, `${file}.new`);
  await rename(`${file}.new`, file);
}

async function writeKeys(...keys: string[]): Promise<void> {
  const file = join(keysDir, "keys.yaml");
  const text = ["keys:", ...keys.map((k) => `  - {sha256: ${keyDigest(k)}, tenant: acme}`), ""];
  await writeFile(`${file}.new`, text.join("\n"));
  await rename(`${file}.new`, file);
}

/** Users of the server's client connections (not its own internal ones). */
async function connectedUsers(): Promise<string[]> {
  const res = await fetch(`${server.monitorUrl}/connz?auth=true&limit=1000`);
  const connz = (await res.json()) as { connections?: { authorized_user?: string }[] };
  return (connz.connections ?? []).map((c) => c.authorized_user ?? "");
}

async function healthOf(service: ServiceProcess): Promise<number> {
  const line = await service.waitForLog((l) => l.msg === "health served at /healthz and /readyz");
  return (await fetch(`http://127.0.0.1:${line.port as number}/healthz`)).status;
}

const post = (key: string) =>
  fetch(gateway.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      authorization: `Bearer ${key}`,
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
  pki = await createTestPki();
  renewed = await issueClientCertificate(pki, "client-renewed");
  [roleDir, keysDir] = await Promise.all([
    mkdtemp(join(tmpdir(), "toolmesh-role-tls-")),
    mkdtemp(join(tmpdir(), "toolmesh-gateway-keys-")),
  ]);
  await Promise.all([
    replace(join(roleDir, "tls.crt"), pki.clientCert),
    replace(join(roleDir, "tls.key"), pki.clientKey),
    replace(join(roleDir, "ca.crt"), pki.caFile),
    writeKeys(OLD_KEY),
  ]);
  server = await startNatsServer({ jetstream: false, config: serverConfig("client") });
  const tools = await gatewayTools();
  const env = {
    NATS_URL: server.url,
    NATS_CA: join(roleDir, "ca.crt"),
    NATS_CERT: join(roleDir, "tls.crt"),
    NATS_KEY: join(roleDir, "tls.key"),
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
    TOOLMESH_HEALTH_PORT: "0",
    TOOLMESH_LIVENESS_DISCONNECTED_MS: "1500",
  };
  [resolver, executor] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo");
  gateway = await startGateway({
    ...env,
    TOOLMESH_GATEWAY_KEYS_FILE: join(keysDir, "keys.yaml"),
  });
}, 150_000);

afterAll(async () => {
  await killAllServices();
  await server?.stop();
  for (const dir of [roleDir, keysDir])
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
  await pki?.remove();
});

it("reconnects with a renewed client certificate and goes dead on /healthz while it cannot, with no restart", async () => {
  const pids = [resolver.pid, executor.pid, gateway.process.pid];
  const before = await connectedUsers();
  expect(new Set(before)).toEqual(new Set(["CN=client"]));

  // The old certificate is no longer accepted (expired, revoked): the server closes the services'
  // connections and refuses them; past the bound they report themselves dead.
  await server.reload(serverConfig("client-renewed"));
  await vi.waitFor(
    async () => {
      expect(await healthOf(executor)).toBe(503);
      expect(await healthOf(resolver)).toBe(503);
      expect((await fetch(`http://127.0.0.1:${gateway.port}/healthz`)).status).toBe(503);
    },
    { timeout: 20_000, interval: 200 },
  );

  // The renewed certificate lands in the mounted files: each service reconnects with it.
  await replace(join(roleDir, "tls.key"), renewed.key);
  await replace(join(roleDir, "tls.crt"), renewed.cert);
  // Every connection is back, each with the renewed certificate.
  await vi.waitFor(
    async () => {
      expect(await connectedUsers()).toEqual(before.map(() => "CN=client-renewed"));
      expect(await healthOf(executor)).toBe(200);
      expect(await healthOf(resolver)).toBe(200);
      expect((await fetch(`http://127.0.0.1:${gateway.port}/healthz`)).status).toBe(200);
    },
    { timeout: 50_000, interval: 200 },
  );
  expect([resolver.pid, executor.pid, gateway.process.pid]).toEqual(pids);
  for (const s of [resolver, executor, gateway.process]) expect(s.child.exitCode).toBeNull();
}, 90_000);

it("accepts a key added to the gateway's keys file and refuses a removed one, with no restart", async () => {
  const pid = gateway.process.pid;
  expect((await post(OLD_KEY)).status).toBe(200);
  expect((await post(NEW_KEY)).status).toBe(401);
  await writeKeys(NEW_KEY);
  await expect.poll(async () => (await post(NEW_KEY)).status, { timeout: 20_000 }).toBe(200);
  expect((await post(OLD_KEY)).status).toBe(401);
  // A broken file keeps the keys in force.
  await writeFile(join(keysDir, "keys.yaml"), "keys: [{sha256: nope}]\n");
  await gateway.process.waitForLog(
    (l) => l.msg === "the keys file changed but cannot be used; the keys in force stay",
    20_000,
  );
  expect((await post(NEW_KEY)).status).toBe(200);
  // The whole path works with the new key over the renewed certificate.
  const client = await mcpClient(gateway.url, NEW_KEY);
  const result = await client.callTool({
    name: "echo",
    arguments: { text: "rotated" },
  });
  expect(result.isError ?? false).toBe(false);
  expect(JSON.stringify(result.content)).toContain("rotated");
  await client.close();
  expect(gateway.process.pid).toBe(pid);
  expect(gateway.process.child.exitCode).toBeNull();
}, 60_000);
