import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createHash, randomBytes } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { ToolmeshClient } from "@toolmesh/client";
import { ErrorCode, createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { startResolver } from "@toolmesh/resolver";
import type { Resolver } from "@toolmesh/resolver";
import { SecretBox, startExecutor } from "@toolmesh/tool-host";
import type { Executor, ToolModule } from "@toolmesh/tool-host";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { runCliWithInput } from "./helpers/cli.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";
import { startTestMcpServer } from "./helpers/mcp-test-server.js";
import type { TestMcpServer } from "./helpers/mcp-test-server.js";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { McpServerConfigSchema, startBridge } from "@toolmesh/mcp-bridge";
import type { Bridge } from "@toolmesh/mcp-bridge";

// The users' secrets of an owner's tools live in the owner's own NATS account (ADR 0061): its
// operator stores them there with `toolmesh secrets set`, its executor opens them for its
// callers, and nobody else reaches them. Each attacker is a principal of the generated
// configuration (another owner's executor, that owner with every right in its account, a
// tenant's frontend, the gateway, a mesh user with every right), reading directly and pointing
// JetStream answers at the bucket's KV subjects and API (NATS-NOTES' first trap). A control
// shows the same trap writing into the bucket from inside the owner's account, so the
// assertions can fail.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const log = createLogger({ service: "test", level: "silent" });
const KEYS = `k1:${randomBytes(32).toString("base64")}`;
const ALICE_SECRET = `alice-crm-${randomBytes(8).toString("hex")}`;
const BUCKET = subjects.userSecretsBucket;
const ALICE_KEY = subjects.userSecretKey("t1", "alice", "crm_lookup");
const STREAM = `KV_${BUCKET}`;

const sha = (value: string) => createHash("sha256").update(value).digest("hex");

// Answers with a digest of the caller's secret: the secret itself never enters a message.
const tools: ToolModule[] = [
  {
    name: "crm_lookup",
    description: "Looks the caller up with their own key.",
    parameters: { type: "object", properties: {} },
    credentials: { type: "user-secret" },
    handler: (_args, ctx) => ({ key_sha256: sha(ctx.credential ?? "") }),
  },
];

let server: NatsServerHandle;
let mesh: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let executor: Executor;
let bridge: Bridge | undefined;
let meshBridge: Bridge | undefined;
let mcpServer: TestMcpServer | undefined;
let crm: Server | undefined;
let client: ToolmeshClient;
const open: NatsConnection[] = [];

async function as(user: string, inboxPrefix?: string): Promise<NatsConnection> {
  const nc = await connect({
    servers: server.url,
    user,
    pass: user,
    ...(inboxPrefix === undefined ? {} : { inboxPrefix }),
  });
  open.push(nc);
  return nc;
}

function cliAs(user: string): Record<string, string> {
  return {
    NATS_URL: server.url,
    NATS_USER: user,
    NATS_PASSWORD: user,
    TOOLMESH_SECRET_KEYS: KEYS,
  };
}

/** The victim's stored entry, read by its own operator: revision and sealed value. */
async function victimEntry(): Promise<{ revision: number; value: string } | null> {
  const nc = await as("operator-victim", subjects.inboxPrefix("operator"));
  const kv = await new Kvm(nc).open(BUCKET);
  const entry = await kv.get(ALICE_KEY);
  return entry === null ? null : { revision: entry.revision, value: entry.string() };
}

async function call(id: string, subject: string, tool = "crm_lookup") {
  const session = client.session(`secrets-${id}`);
  try {
    return await session.submit(
      { id, name: tool, arguments: {} },
      { identity: { issuer: "https://idp.t1.test/", subject, tenant: "t1" } },
    ).result;
  } finally {
    session.close();
  }
}

/**
 * A bridge on `nc` serving the test MCP server as `server` (its tools act with their caller's
 * secret), once its `caller` tool is in the registry.
 */
async function bridgeAs(
  nc: NatsConnection,
  server: string,
  where: { ownerAccount: string } | { registry: ToolRegistry },
): Promise<Bridge> {
  const started = await startBridge({
    nc,
    subjects,
    ...where,
    servers: [
      McpServerConfigSchema.parse({
        name: server,
        transport: "http",
        url: mcpServer?.url,
        credentials: { type: "user-secret" },
      }),
    ],
    env: {},
    secretBox: SecretBox.fromKeyList(KEYS, "TOOLMESH_SECRET_KEYS"),
    log,
    tracer: initTelemetry({ serviceName: "test", env: {} }).tracer,
  });
  for (let i = 0; registry.get(`${server}.caller`) === undefined; i++) {
    if (i === 400) throw new Error(`${server}.caller was never registered`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return started;
}

/** Publishes `subject` with its answer sent to `reply`, then waits for the server to act. */
async function trap(nc: NatsConnection, subject: string, reply: string): Promise<void> {
  nc.publish(subject, "", { reply });
  await nc.flush();
  await new Promise((resolve) => setTimeout(resolve, 200));
}

beforeAll(async () => {
  server = await startNatsServer({
    config: ownerAccountsConfig(
      subjects,
      { victim: ["crm_lookup", "crm.*"], rogue: [], fresh: ["fresh_lookup"] },
      ["t1"],
    ),
  });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer });
  const stored = await runCliWithInput(
    ["secrets", "set", "--tenant", "t1", "--subject", "alice", "--tool", "crm_lookup"],
    cliAs("operator-victim"),
    `${ALICE_SECRET}\n`,
  );
  expect(stored).toMatchObject({ code: 0, stderr: "" });
  const executorNc = await as("executor-victim", subjects.ownerInboxPrefix("executor", "victim"));
  executor = await startExecutor({
    nc: executorNc,
    subjects,
    ownerAccount: "victim",
    tools,
    secretBox: SecretBox.fromKeyList(KEYS, "TOOLMESH_SECRET_KEYS"),
    log,
    tracer,
  });
  client = new ToolmeshClient(mesh, { tenant: "t1", defaultTimeoutMs: 20_000 });
}, 90_000);

afterAll(async () => {
  await bridge?.stop(1_000);
  await meshBridge?.stop(1_000);
  mcpServer?.child.kill();
  await new Promise((resolve) => crm?.close(resolve) ?? resolve(undefined));
  await executor?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh, ...open].map((nc) => nc?.close()));
  await server?.stop();
});

describe("users' secrets of an owner's tools, in the owner's account", () => {
  it("are stored by the owner's operator and opened by its executor for that user only", async () => {
    const alice = await call("alice-1", "alice");
    expect(alice.error).toBeUndefined();
    expect(JSON.parse(alice.content)).toEqual({ key_sha256: sha(ALICE_SECRET) });
    const bob = await call("bob-1", "bob");
    expect(bob.error?.code).toBe(ErrorCode.CredentialRequired);
    const list = await runCliWithInput(
      ["secrets", "list", "--tenant", "t1", "--subject", "alice"],
      cliAs("operator-victim"),
      "",
    );
    expect(list).toMatchObject({ code: 0, stdout: "crm_lookup\n" });
  });

  it("are opened by the owner's MCP bridge, as its generated user, for an MCP server over HTTP", async () => {
    // The CRM answers whose key it got; the MCP server's `caller` tool asks it with the
    // Authorization of its tools/call request.
    crm = createServer((req, res) => {
      const key = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
      res.writeHead(key === undefined ? 401 : 200, { "content-type": "application/json" });
      res.end(JSON.stringify(key === undefined ? { error: "no key" } : { key_sha256: sha(key) }));
    });
    await new Promise<void>((resolve) => crm?.listen(0, "127.0.0.1", resolve));
    const crmUrl = `http://127.0.0.1:${(crm.address() as AddressInfo).port}/me`;
    mcpServer = await startTestMcpServer("--http", { MCP_TEST_CALLER_API: crmUrl });
    const stored = await runCliWithInput(
      ["secrets", "set", "--tenant", "t1", "--subject", "alice", "--tool", "crm.caller"],
      cliAs("operator-victim"),
      ALICE_SECRET,
    );
    expect(stored.code).toBe(0);
    bridge = await bridgeAs(
      await as("mcp-bridge-victim", subjects.ownerInboxPrefix("mcp-bridge", "victim")),
      "crm",
      { ownerAccount: "victim" },
    );
    const alice = await call("alice-mcp", "alice", "crm.caller");
    expect(alice.error).toBeUndefined();
    expect(JSON.parse(alice.content)).toEqual({ key_sha256: sha(ALICE_SECRET) });
    const bob = await call("bob-mcp", "bob", "crm.caller");
    expect(bob.error?.code).toBe(ErrorCode.CredentialRequired);
  });

  it("are not in the mesh account, whatever a mesh principal reads", async () => {
    // The mesh's own bucket (what `toolmesh setup` provisions) holds nothing of the owner's.
    const kv = await new Kvm(mesh).create(BUCKET, { history: 1 });
    expect(await kv.get(ALICE_KEY)).toBeNull();
    const jsm = await jetstreamManager(mesh);
    expect((await jsm.streams.info(STREAM)).state.messages).toBe(0);
    // The mesh's operator lists the mesh's bucket, never an owner's.
    const meshOperator = await runCliWithInput(
      ["secrets", "list", "--tenant", "t1", "--subject", "alice"],
      cliAs("operator"),
      "",
    );
    expect(meshOperator).toMatchObject({ code: 0, stdout: "\n" });
  });

  it("are opened by the mesh account's MCP bridge, as its generated user, from the mesh's bucket", async () => {
    // The same MCP server, bridged in the mesh account: the secret is the mesh operator's to
    // store, in the mesh's bucket (made above, as `toolmesh setup` does), and the bridge's
    // generated user reads it there.
    const stored = await runCliWithInput(
      ["secrets", "set", "--tenant", "t1", "--subject", "alice", "--tool", "meshcrm.caller"],
      cliAs("operator"),
      ALICE_SECRET,
    );
    expect(stored.code).toBe(0);
    meshBridge = await bridgeAs(
      await as("mcp-bridge", subjects.inboxPrefix("mcp-bridge")),
      "meshcrm",
      { registry },
    );
    const alice = await call("alice-mesh-mcp", "alice", "meshcrm.caller");
    expect(alice.error).toBeUndefined();
    expect(JSON.parse(alice.content)).toEqual({ key_sha256: sha(ALICE_SECRET) });
  });

  it("are kept in a bucket an owner's first executor of such tools makes, the one stream it may make", async () => {
    const nc = await as("executor-fresh", subjects.ownerInboxPrefix("executor", "fresh"));
    const jsm = await jetstreamManager(await as("fresh"));
    await expect(jsm.streams.info(STREAM)).rejects.toThrow(/stream not found/);
    const fresh = await startExecutor({
      nc,
      subjects,
      ownerAccount: "fresh",
      tools: [{ ...tools[0]!, name: "fresh_lookup" }],
      secretBox: SecretBox.fromKeyList(KEYS, "TOOLMESH_SECRET_KEYS"),
      userSecretsReplicas: 1,
      log,
      tracer: initTelemetry({ serviceName: "test", env: {} }).tracer,
    });
    try {
      expect((await jsm.streams.info(STREAM)).config).toMatchObject({
        num_replicas: 1,
        max_msgs_per_subject: 1,
      });
      const stored = await runCliWithInput(
        ["secrets", "set", "--tenant", "t1", "--subject", "carol", "--tool", "fresh_lookup"],
        cliAs("operator-fresh"),
        "carol-secret\n",
      );
      expect(stored).toMatchObject({ code: 0, stderr: "" });
      const carol = await call("carol-1", "carol", "fresh_lookup");
      expect(JSON.parse(carol.content)).toEqual({ key_sha256: sha("carol-secret") });
      // Its user may make that bucket, and no other stream.
      await expect(
        nc.request(
          "$JS.API.STREAM.CREATE.KV_other",
          JSON.stringify({ name: "KV_other", subjects: ["$KV.other.>"] }),
          { timeout: 2_000 },
        ),
      ).rejects.toThrow();
      await expect(jsm.streams.info("KV_other")).rejects.toThrow(/stream not found/);
    } finally {
      await fresh.stop(1_000);
    }
  });

  it("cannot be read by another owner's executor, nor that owner with every right in its account", async () => {
    const rogueExecutor = await as(
      "executor-rogue",
      subjects.ownerInboxPrefix("executor", "rogue"),
    );
    const rogueKv = await new Kvm(rogueExecutor).open(BUCKET);
    expect(await rogueKv.get(ALICE_KEY).catch(() => null)).toBeNull();
    const rogue = await as("rogue");
    // Its own account's JetStream holds no such bucket; a bucket it makes is its own.
    const kv = await new Kvm(rogue).create(BUCKET, { history: 1 });
    expect(await kv.get(ALICE_KEY)).toBeNull();
    // The mesh's JetStream API is reachable only as the crossings it imports: no direct get.
    await expect(
      rogue.request(
        `${subjects.ownerJsApiPrefix}.DIRECT.GET.${STREAM}.$KV.${BUCKET}.${ALICE_KEY}`,
        "",
        { timeout: 2_000 },
      ),
    ).rejects.toThrow();
  });

  it("cannot be read by a tenant's frontend or the gateway", async () => {
    const frontend = await as("frontend-t1", subjects.frontendInboxPrefix("t1"));
    await expect(
      frontend.request(`$JS.API.DIRECT.GET.${STREAM}.$KV.${BUCKET}.${ALICE_KEY}`, "", {
        timeout: 2_000,
      }),
    ).rejects.toThrow();
    const gateway = await as("gateway", subjects.inboxPrefix("gateway"));
    await expect(
      gateway.request(`$JS.API.DIRECT.GET.${STREAM}.$KV.${BUCKET}.${ALICE_KEY}`, "", {
        timeout: 2_000,
      }),
    ).rejects.toThrow();
  });

  it("cannot be written, purged or deleted through JetStream answers from outside the account", async () => {
    const before = await victimEntry();
    expect(before).not.toBeNull();
    const targets = [
      `$KV.${BUCKET}.${ALICE_KEY}`,
      `$JS.API.STREAM.PURGE.${STREAM}`,
      `$JS.API.STREAM.DELETE.${STREAM}`,
    ];
    const gateway = await as("gateway", subjects.inboxPrefix("gateway"));
    const rogue = await as("rogue");
    const frontend = await as("frontend-t1", subjects.frontendInboxPrefix("t1"));
    const rogueCrossing = `${subjects.ownerJsApiPrefix}.CONSUMER.INFO.${subjects.workStream("rogue")}.x`;
    for (const reply of targets) {
      await trap(gateway, "$JS.API.INFO", reply);
      await trap(mesh, "$JS.API.INFO", reply);
      await trap(rogue, rogueCrossing, reply);
      await trap(frontend, `${subjects.prefix}.v1.rpc.t1.x`, reply);
    }
    expect(await victimEntry()).toEqual(before);
    const alice = await call("alice-2", "alice");
    expect(JSON.parse(alice.content)).toEqual({ key_sha256: sha(ALICE_SECRET) });
  });

  it("control: the same answer from inside the owner's account lands in the bucket", async () => {
    const insider = await as("victim");
    const key = subjects.userSecretKey("t1", "zed", "crm_lookup");
    await trap(insider, "$JS.API.INFO", `$KV.${BUCKET}.${key}`);
    const kv = await new Kvm(insider).open(BUCKET);
    expect(await kv.get(key)).not.toBeNull();
  });
});
