import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { ToolmeshClient } from "@toolmesh/client";
import { requestOk } from "@toolmesh/nats";
import { DelegationDepositReplySchema, ErrorCode, createSubjects } from "@toolmesh/protocol";
import type { DelegationDeposit } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { startResolver } from "@toolmesh/resolver";
import type { Resolver } from "@toolmesh/resolver";
import { SecretBox, startExecutor } from "@toolmesh/tool-host";
import type { Executor, ToolModule } from "@toolmesh/tool-host";
import { createLogger, initTelemetry } from "@toolmesh/telemetry";
import { exchange, startAuthServer } from "./helpers/auth-server.js";
import type { AuthServer } from "./helpers/auth-server.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { ownerAccountsConfig } from "./helpers/owner-accounts.js";
import { eventually } from "./helpers/eventually.js";

// The delegation grants of an owner's token-exchange tools are handed by the gateway to the
// owner's executors, through the one service the owner's account exports to the mesh, and
// sealed in the owner's own bucket: its executor buys the caller's token with it, and no other
// principal (another owner's executor, that owner with every right, a tenant's frontend, the
// gateway that deposited it) can read it or take the deposits.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const log = createLogger({ service: "test", level: "silent" });
const KEYS = `k1:${randomBytes(32).toString("base64")}`;
const CLIENT = { id: "toolmesh", secret: `client-${randomBytes(8).toString("hex")}` };
const API_AUDIENCE = "https://api.example.test/";
const BUCKET = subjects.userSecretsBucket;
const STREAM = `KV_${BUCKET}`;

let server: NatsServerHandle;
let as: AuthServer;
let mesh: NatsConnection;
let registry: ToolRegistry;
let resolver: Resolver;
let executor: Executor;
let client: ToolmeshClient;
const open: NatsConnection[] = [];
const grants: string[] = [];

async function connectAs(user: string, inboxPrefix?: string): Promise<NatsConnection> {
  const nc = await connect({
    servers: server.url,
    user,
    pass: user,
    ...(inboxPrefix === undefined ? {} : { inboxPrefix }),
  });
  open.push(nc);
  return nc;
}

/** What the gateway does at submission: exchanges alice's token, deposits the grant. */
async function deposit(callId: string, sub = "alice"): Promise<DelegationDeposit> {
  const token = (await as.admin<{ token: string }>("login", { sub, tenant: "t1" })).token;
  const exchanged = await exchange(as.url, CLIENT, token, API_AUDIENCE);
  const grant = exchanged.access_token as string;
  grants.push(grant);
  const d: DelegationDeposit = {
    call_id: callId,
    identity: { issuer: as.idpIssuer, subject: sub, tenant: "t1" },
    audience: API_AUDIENCE,
    grant,
  };
  const gateway = await connectAs("gateway", subjects.inboxPrefix("gateway"));
  await requestOk(gateway, subjects.delegationDeposit("victim"), d, DelegationDepositReplySchema, {
    service: "executor of whoami",
    timeoutMs: 5_000,
  });
  return d;
}

async function call(id: string, sub: string) {
  const session = client.session(`deleg-${id}`);
  try {
    return await session.submit(
      { id, name: "whoami", arguments: {} },
      { identity: { issuer: as.idpIssuer, subject: sub, tenant: "t1" } },
    ).result;
  } finally {
    session.close();
  }
}

beforeAll(async () => {
  as = await startAuthServer({
    gatewayAudience: "https://tools.example.test/mcp",
    apiAudience: API_AUDIENCE,
    clientId: CLIENT.id,
    clientSecret: CLIENT.secret,
  });
  await as.admin("consent", { sub: "alice", audience: API_AUDIENCE });
  server = await startNatsServer({
    config: ownerAccountsConfig(subjects, { victim: ["whoami"], rogue: [] }, ["t1"]),
  });
  mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  registry = await ToolRegistry.open(mesh, { subjects, log });
  const tracer = initTelemetry({ serviceName: "test", env: {} }).tracer;
  resolver = await startResolver({ nc: mesh, subjects, registry, log, tracer });
  // The owner's operator makes the bucket of its users' secrets, in its own account.
  const operator = await connectAs("operator-victim", subjects.inboxPrefix("operator"));
  await new Kvm(operator).create(BUCKET, { history: 1 });
  const api = `${as.url}/api/whoami`;
  const tools: ToolModule[] = [
    {
      name: "whoami",
      description: "Who the API says the caller is.",
      parameters: { type: "object", properties: {} },
      credentials: { type: "token-exchange", audience: API_AUDIENCE, scopes: ["api:read"] },
      handler: async (_args, ctx) => {
        const res = await fetch(api, { headers: { authorization: `Bearer ${ctx.credential}` } });
        return await res.json();
      },
    },
  ];
  executor = await startExecutor({
    nc: await connectAs("executor-victim", subjects.ownerInboxPrefix("executor", "victim")),
    subjects,
    ownerAccount: "victim",
    tools,
    secretBox: SecretBox.fromKeyList(KEYS, "TOOLMESH_SECRET_KEYS"),
    tokenEndpoint: { url: `${as.url}/token`, clientId: CLIENT.id, clientSecret: CLIENT.secret },
    log,
    tracer,
  });
  client = new ToolmeshClient(mesh, { tenant: "t1", defaultTimeoutMs: 20_000 });
}, 90_000);

afterAll(async () => {
  await executor?.stop(1_000);
  await resolver?.stop(1_000);
  registry?.close();
  await Promise.all([mesh, ...open].map((nc) => nc?.close()));
  await server?.stop();
  as?.process.kill();
});

describe("delegation grants of an owner's tools, in the owner's account", () => {
  it("are deposited by the gateway, sealed in the owner's bucket, and act for that call only", async () => {
    const d = await deposit("owner-1");
    const operator = await connectAs("operator-victim", subjects.inboxPrefix("operator"));
    const kv = await new Kvm(operator).open(BUCKET);
    const key = subjects.delegationGrantKey("t1", "alice", API_AUDIENCE, "owner-1");
    const sealed = (await kv.get(key))?.string() ?? "";
    expect(JSON.parse(sealed)).toMatchObject({ v: 1, kid: "k1" });
    expect(sealed).not.toContain(d.grant);
    const alice = await call("owner-1", "alice");
    expect(alice.error).toBeUndefined();
    expect(JSON.parse(alice.content)).toEqual({ sub: "alice", aud: API_AUDIENCE });
    // Ended: its grant is gone. Another call of alice's came with none.
    await eventually("the grant purged", async () =>
      (await kv.get(key))?.operation === "PUT" ? undefined : true,
    );
    const other = await call("owner-2", "alice");
    expect(other.error?.code).toBe(ErrorCode.CredentialRequired);
  });

  it("cannot be read by another owner's executor, that owner, a frontend or the gateway", async () => {
    await deposit("owner-3");
    const key = subjects.delegationGrantKey("t1", "alice", API_AUDIENCE, "owner-3");
    const rogueExecutor = await connectAs(
      "executor-rogue",
      subjects.ownerInboxPrefix("executor", "rogue"),
    );
    expect(await (await new Kvm(rogueExecutor).open(BUCKET)).get(key).catch(() => null)).toBeNull();
    const rogue = await connectAs("rogue");
    expect(await (await new Kvm(rogue).create(BUCKET, { history: 1 })).get(key)).toBeNull();
    const frontend = await connectAs("frontend-t1", subjects.frontendInboxPrefix("t1"));
    const gateway = await connectAs("gateway", subjects.inboxPrefix("gateway"));
    // No answer, or an empty one from the asker's own account (its bucket, if any, has none).
    for (const nc of [frontend, gateway, rogue]) {
      const reply = await nc
        .request(`$JS.API.DIRECT.GET.${STREAM}.$KV.${BUCKET}.${key}`, "", { timeout: 2_000 })
        .catch(() => undefined);
      expect(reply === undefined || reply.data.length === 0).toBe(true);
    }
    // Control: the same read from inside the owner's account answers the sealed value.
    const operator = await connectAs("operator-victim", subjects.inboxPrefix("operator"));
    const inside = await operator.request(`$JS.API.DIRECT.GET.${STREAM}.$KV.${BUCKET}.${key}`, "", {
      timeout: 2_000,
    });
    expect(JSON.parse(inside.string())).toMatchObject({ v: 1, kid: "k1" });
  });

  it("cannot be taken on the way: another owner and a frontend hear no deposit, and cannot make one", async () => {
    const rogue = await connectAs("rogue");
    const rogueExecutor = await connectAs(
      "executor-rogue",
      subjects.ownerInboxPrefix("executor", "rogue"),
    );
    const heard: string[] = [];
    rogue.subscribe(">", {
      callback: (_e, m) => {
        heard.push(m.string());
      },
    });
    await rogue.flush();
    // The generated rogue executor may not even listen to the victim's deposits.
    const denied = rogueExecutor.subscribe(subjects.delegationDeposit("victim"));
    const closed = denied.closed.then(
      () => "closed",
      () => "refused",
    );
    const d = await deposit("owner-4");
    expect(heard.some((m) => m.includes(d.grant))).toBe(false);
    expect(
      await Promise.race([closed, new Promise((r) => setTimeout(() => r("open"), 2_000))]),
    ).not.toBe("open");
    const frontend = await connectAs("frontend-t1", subjects.frontendInboxPrefix("t1"));
    await expect(
      requestOk(
        frontend,
        subjects.delegationDeposit("victim"),
        { ...d, call_id: "forged" },
        DelegationDepositReplySchema,
        {
          service: "executor",
          timeoutMs: 2_000,
        },
      ),
    ).rejects.toThrow();
    await expect(
      requestOk(
        rogue,
        subjects.delegationDeposit("victim"),
        { ...d, call_id: "forged" },
        DelegationDepositReplySchema,
        {
          service: "executor",
          timeoutMs: 2_000,
        },
      ),
    ).rejects.toThrow();
    const operator = await connectAs("operator-victim", subjects.inboxPrefix("operator"));
    const kv = await new Kvm(operator).open(BUCKET);
    expect(
      await kv.get(subjects.delegationGrantKey("t1", "alice", API_AUDIENCE, "forged")),
    ).toBeNull();
  });
});
