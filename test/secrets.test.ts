import { once } from "node:events";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import { killAllServices, startService, type ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { startOtlpReceiver, type OtlpReceiver } from "./helpers/otlp-receiver.js";

// Calls that carry every kind of secret — the NATS password of the services, a native tool's
// API key sent as a header (and echoed back by the API, in a result and in an error), and a
// preset value from the presets file — with debug logs and tracing on. None of the values may
// show in any service's output, in an exported span or in what the caller gets back.

const SECRETS = {
  natsPassword: "nats-pw-5c1d7e0a-secret",
  apiKey: "api-key-8b2f44d1-secret",
  preset: "preset-9e03aa57-secret",
};

let nats: NatsServerHandle;
let api: Server;
let receiver: OtlpReceiver;
let dir: string;
let services: ServiceProcess[];
let nc: NatsConnection;
let client: ToolmeshClient;

beforeAll(async () => {
  receiver = await startOtlpReceiver();
  // An API that echoes the credential it was sent, in its answer and in its error.
  api = createServer((req, res) => {
    const key = String(req.headers["x-api-key"]);
    res.writeHead(req.url?.startsWith("/fail") ? 401 : 200, {
      "content-type": "application/json",
    });
    res.end(JSON.stringify({ you_sent: key, path: req.url }));
  });
  api.listen(0, "127.0.0.1");
  await once(api, "listening");
  const port = (api.address() as AddressInfo).port;
  dir = await mkdtemp(join(tmpdir(), "toolmesh-secrets-"));
  await mkdir(join(dir, "tools"));
  await mkdir(join(dir, "native"));
  await writeFile(
    join(dir, "tools", "vault.js"),
    `export default {
      name: "vault",
      description: "Opens the vault with a preset token.",
      parameters: {
        type: "object",
        properties: { door: { type: "string" }, token: { type: "string" } },
        required: ["door"],
      },
      presets: { token: "placeholder" },
      handler: ({ door, token }) => \`opened \${door} with a token of \${token.length} characters\`,
    };\n`,
  );
  await writeFile(join(dir, "presets.yaml"), `vault:\n  token: ${SECRETS.preset}\n`);
  for (const [name, path] of [
    ["keyed", "/ok"],
    ["keyed_fail", "/fail"],
  ]) {
    await writeFile(
      join(dir, "native", `${name}.yaml`),
      [
        `name: ${name}`,
        "description: Calls the API with a key.",
        `api_url: http://127.0.0.1:${port}${path}`,
        "auth: { method: api_key, header: X-API-Key, env: VAULT_API_KEY }",
        "retry: { max_attempts: 1 }",
      ].join("\n"),
    );
  }
  nats = await startNatsServer({
    config: `authorization { users: [ { user: mesh, password: "${SECRETS.natsPassword}" } ] }`,
  });
  const env = {
    NATS_URL: nats.url,
    NATS_USER: "mesh",
    NATS_PASSWORD: SECRETS.natsPassword,
    TOOLMESH_LOG_LEVEL: "trace",
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: "50",
  };
  services = await Promise.all([
    startService("resolver", env),
    startService("executor", {
      ...env,
      TOOLMESH_TOOLS_DIR: join(dir, "tools"),
      TOOLMESH_NATIVE_TOOLS_DIR: join(dir, "native"),
      TOOLMESH_PRESETS_FILE: join(dir, "presets.yaml"),
      TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "127.0.0.1",
      VAULT_API_KEY: SECRETS.apiKey,
    }),
  ]);
  nc = await connectNats({ servers: nats.url, user: "mesh", password: SECRETS.natsPassword });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 20_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await nats?.stop();
  await stopAll();
  api?.close();
  await receiver?.close();
  await rm(dir, { recursive: true, force: true });
});

describe("secrets", () => {
  it("never reach logs, spans or results", async () => {
    const session = client.session("secret-session");
    const results = await Promise.all([
      session.submit({ name: "vault", arguments: { door: "front" } }).result,
      session.submit({ name: "vault", arguments: {} }).result, // missing_arguments, with the schema
      session.submit({ name: "keyed", arguments: {} }).result,
      session.submit({ name: "keyed_fail", arguments: {} }).result,
    ]);
    session.close();
    expect(results[0]?.content).toBe(
      `opened front with a token of ${SECRETS.preset.length} characters`,
    );
    expect(results[1]?.error?.code).toBe("missing_arguments");
    expect(results[2]?.content).toContain('"you_sent":"[redacted]"');
    expect(results[3]?.error?.code).toBe("tool_error");
    // Every call's spans were exported: the executor's "process" span of each tool.
    await receiver.waitFor(
      (spans) =>
        ["vault", "keyed", "keyed_fail"].every((tool) =>
          spans.some((s) => s.name === `process ${tool}`),
        ),
      20_000,
    );
    const exposed = [
      JSON.stringify(results),
      JSON.stringify(receiver.spans()),
      ...services.map((s) => JSON.stringify(s.lines) + s.stderr()),
    ].join("\n");
    expect(exposed.length).toBeGreaterThan(1000);
    for (const [what, secret] of Object.entries(SECRETS)) {
      expect(exposed.includes(secret), `${what} leaked`).toBe(false);
    }
  });
});
