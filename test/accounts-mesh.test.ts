import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { PermissionViolationError, headers as createHeaders } from "@nats-io/nats-core";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { renderAccountConfig, rolePermissions, tenantAccount } from "@toolmesh/nats";
import type { AccountConfigOptions } from "@toolmesh/nats";
import { ToolmeshClient } from "@toolmesh/client";
import { MeshCredentialLimits } from "@toolmesh/gateway";
import { ApprovalsAtRest } from "@toolmesh/call-store";
import { connectNats } from "@toolmesh/nats";
import { Header, createSubjects, encodeJson } from "@toolmesh/protocol";
import { BIN, runCli } from "./helpers/cli.js";
import { writeStdioTestServer } from "./helpers/mcp-test-server.js";
import { killAllServices, startService, type ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// The whole mesh under the accounts `toolmesh auth config` generates (the code the shipped
// deploy/nats/toolmesh.conf is checked against), on a server that requires TLS client
// certificates: the services in the mesh account, each frontend in its tenant's account,
// reaching the mesh only through the generated exports and imports.
//
// The builtin executor and the MCP bridge run as the mesh account's generated users `executor`
// and `mcp-bridge` (trusted like a service); tool owner `billing` runs an executor of its own
// in its account, as the generated user `executor-billing`, serving `late.arrival` through the
// owner services and its tool's work-consumer crossings.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const subjects = createSubjects();
// Services start slowly on a loaded machine; readiness is still their log line.
const START_MS = 120_000;

let pki: TestPki;
let server: NatsServerHandle;
let work: string;
const { password, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));
let services: ServiceProcess[] = [];

/**
 * The server configuration: the generated accounts, the test's users, TLS, and the password of
 * every user as a variable defined in the file itself, so that a reload can add a user (the
 * server's environment is fixed when it starts; docs/security.md says the same).
 */
function serverConfig(tenants: string[]): string {
  const options: AccountConfigOptions = {
    tenants,
    owners: { billing: ["late.arrival"] },
    extraUsers: [
      {
        account: tenantAccount("acme"),
        user: "frontend-acme-s1",
        permissions: rolePermissions("frontend", { tenant: "acme", session: "s1" }),
      },
    ],
  };
  const accounts = renderAccountConfig(options);
  const variables = [...accounts.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g)].map(
    ([, user, variable]) => `${variable}: ${JSON.stringify(password(user!))}`,
  );
  // JetStream is configured in the file, as in production: a server started with `-js` on the
  // command line restarts JetStream on a reload of a file without it.
  const js = `jetstream { store_dir: ${JSON.stringify(join(work, "js"))} }`;
  return [js, ...variables, accounts, pki.serverTlsBlock(), ""].join("\n");
}

/** Permission violations the server reported on a connection, collected as they come. */
function violations(nc: NatsConnection): PermissionViolationError[] {
  const seen: PermissionViolationError[] = [];
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "error" && s.error instanceof PermissionViolationError) seen.push(s.error);
    }
  })();
  return seen;
}

function settled(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

async function expectPublishRefused(nc: NatsConnection, subject: string): Promise<void> {
  const seen = violations(nc);
  nc.publish(subject, "{}");
  await nc.flush();
  await settled();
  expect(
    seen.some((v) => v.operation === "publish" && v.subject === subject),
    `publish to ${subject} refused`,
  ).toBe(true);
}

async function expectSubscribeRefused(nc: NatsConnection, subject: string): Promise<void> {
  const seen = violations(nc);
  const sub = nc.subscribe(subject);
  await nc.flush();
  await settled();
  expect(
    seen.some((v) => v.operation === "subscription" && v.subject === subject),
    `subscription to ${subject} refused`,
  ).toBe(true);
  sub.unsubscribe();
}

beforeAll(async () => {
  pki = await createTestPki();
  work = await mkdtemp(join(tmpdir(), "toolmesh-accounts-"));
  const mcpDir = join(work, "mcp");
  await mkdir(mcpDir);
  await writeStdioTestServer(mcpDir, "fx");
  server = await startNatsServer({ jetstream: false, config: serverConfig(["acme", "globex"]) });
  const setup = await runCli(["setup", "--tenants", "acme,globex"], credentials("setup"));
  expect(setup.stderr).toBe("");
  expect(setup.code).toBe(0);
  const env = (user: string) => ({ ...credentials(user), TOOLMESH_ACK_WAIT_MS: "2000" });
  services = await Promise.all([
    startService("resolver", env("resolver"), START_MS),
    startService("executor", { ...env("executor"), TOOLMESH_TOOLS_DIR: "tools/builtin" }, START_MS),
    startService("schema-expander", env("schema-expander"), START_MS),
    startService("mcp-bridge", { ...env("mcp-bridge"), TOOLMESH_MCP_DIR: mcpDir }, START_MS),
  ]);
  // The owner's executor waits 30 s for the owner services, which a loaded machine can exceed
  // while the resolver starts: it starts once the resolver is up.
  services.push(
    await startService(
      "executor",
      {
        ...env("executor-billing"),
        TOOLMESH_OWNER: "billing",
        TOOLMESH_TOOLS_DIR: join(ROOT, "test", "fixtures", "tools-b"),
      },
      START_MS,
    ),
  );
}, 3 * START_MS);

afterAll(async () => {
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
  await rm(work, { recursive: true, force: true });
});

describe("the mesh with tenants in their own accounts, under TLS", () => {
  it("refuses an unauthenticated client", async () => {
    const err = await connectNats({
      servers: server.url,
      tlsCa: pki.caFile,
      tlsCert: pki.clientCert,
      tlsKey: pki.clientKey,
    }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).toMatch(/authorization violation/i);
  });

  it("works end to end from a tenant's account: builtin and MCP tools, schema expansion, catalog, dry run, cancel", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 });
    const session = client.session("conv-1");
    const echo = await session.submit({ name: "echo", arguments: { text: "hi" } }).result;
    expect(echo.error).toBeUndefined();
    expect(echo.content).toBe("hi");
    await expect
      .poll(async () => (await client.catalog()).tools.map((t) => t.name), { timeout: 20_000 })
      .toContain("fx.echo");
    const mcp = await session.submit({ name: "fx.echo", arguments: { text: "via mcp" } }).result;
    expect(mcp.content).toBe("via mcp");
    const missing = await session.submit({ name: "get_weather", arguments: {} }).result;
    expect(missing.error?.code).toBe("missing_arguments");
    expect(await session.waitForSchema("get_weather", 10_000)).toBe(true);
    const resolved = await client.resolve("conv-1", { name: "echo", arguments: { text: "x" } });
    expect(resolved.ok).toBe(true);
    const cancel = await session.cancel("never-submitted");
    expect(cancel.error).toBeUndefined();
    // A resubmission is answered from the stored result (a direct get across the accounts).
    const again = await session.submit({
      id: echo.tool_call_id,
      name: "echo",
      arguments: { text: "hi" },
    }).result;
    expect(again.content).toBe("hi");
    session.close();
    for (const service of services) {
      expect(JSON.stringify(service.lines) + service.stderr()).not.toMatch(/permission/i);
    }
  });

  it("a tenant's frontend calls a tool served by an executor in a tool owner's account", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 });
    await expect
      .poll(async () => (await client.catalog()).tools.map((t) => t.name), { timeout: 20_000 })
      .toContain("late.arrival");
    const session = client.session("owned-1");
    const result = await session.submit({ name: "late.arrival", arguments: { n: 21 } }).result;
    expect(result.error).toBeUndefined();
    expect(JSON.parse(result.content)).toEqual({ doubled: 42 });
    session.close();
    // Filed under the owner the mesh took from the owner service's subject.
    const tool = await runCli(["tools", "show", "late.arrival", "--json"], credentials("operator"));
    expect(tool.stderr).toBe("");
    expect((JSON.parse(tool.stdout) as { owner?: string }).owner).toBe("billing");
    for (const service of services) {
      expect(JSON.stringify(service.lines) + service.stderr()).not.toMatch(/permission/i);
    }
  });

  it("the CLI calls as a tenant's frontend with its credentials", async () => {
    const call = await runCli(
      ["--tenant", "acme", "call", "echo", "--args", '{"text":"from the cli"}', "--json"],
      credentials("frontend-acme"),
    );
    expect(call.stderr).toBe("");
    expect(JSON.parse(call.stdout)).toMatchObject({ content: "from the cli" });
  });

  it("the CLI watches as a tenant's frontend: its sessions' events, and one line for the calls it may not see", async () => {
    const child = spawn(
      process.execPath,
      [BIN, "--tenant", "acme", "watch", "--session", "cli-watch", "--json", "--limit", "1"],
      { env: { PATH: process.env.PATH ?? "", ...credentials("frontend-acme") }, stdio: "pipe" },
    );
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    await new Promise<void>((resolve) =>
      child.stderr.on("data", (chunk: Buffer) => {
        stderr += chunk.toString();
        if (stderr.includes("watching session cli-watch")) resolve();
      }),
    );
    const exited = once(child, "exit") as Promise<[number]>;
    const call = await runCli(
      ["--tenant", "acme", "call", "echo", "--session", "cli-watch", "--args", '{"text":"w"}'],
      credentials("frontend-acme"),
    );
    expect(call.code, call.stderr).toBe(0);
    const [code] = await exited;
    expect(code).toBe(0);
    expect(stderr).toContain(
      "toolmesh: this user may not subscribe to toolmesh.v1.calls.acme.cli-watch: what is published there is not shown",
    );
    expect(JSON.parse(stdout)).toMatchObject({ type: "result", session: "cli-watch" });
  });

  it("a session-confined frontend works in its session and nowhere else", async () => {
    const nc = await connectAs("frontend-acme-s1", {
      inboxPrefix: subjects.frontendInboxPrefix("acme", "s1"),
    });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 });
    const session = client.session("s1");
    expect((await session.submit({ name: "echo", arguments: { text: "s1" } }).result).content).toBe(
      "s1",
    );
    session.close();
    await expectSubscribeRefused(nc, "toolmesh.v1.sessions.acme.s2.>");
    await expectPublishRefused(nc, "toolmesh.v1.calls.acme.s2");
    await expectPublishRefused(nc, "toolmesh.v1.cancel.acme.s2");
    await expectPublishRefused(
      nc,
      "$JS.API.DIRECT.GET.TOOLMESH_SESSIONS.toolmesh.v1.sessions.acme.s2.result.c1",
    );
    await expectSubscribeRefused(nc, "_INBOX.toolmesh.frontend.acme.>");
    // One subscription for the tenant's every session is the gateway's, not this frontend's.
    await expectSubscribeRefused(nc, subjects.tenantEvents("acme"));
  });

  it("the gateway's user follows a tenant's sessions through one subscription for the tenant", async () => {
    const nc = await connectAs("gateway", { inboxPrefix: subjects.inboxPrefix("gateway") });
    const seen = violations(nc);
    // As the gateway's clients are: its calls for acme go to acme's own calls stream (ADR 0048).
    const client = new ToolmeshClient(nc, {
      tenant: "acme",
      tenantSubscription: true,
      tenantStream: true,
      defaultTimeoutMs: 20_000,
    });
    const operator = await connectAs("operator", { inboxPrefix: subjects.inboxPrefix("operator") });
    const jsm = await jetstreamManager(operator);
    const stored = async () =>
      (await jsm.streams.info(subjects.callsStream("acme"))).state.last_seq;
    const before = await stored();
    const sessions = ["gw-1", "gw-2"].map((id) => client.session(id));
    const messages = await Promise.all(
      sessions.map((s) => s.submit({ name: "echo", arguments: { text: s.id } }).result),
    );
    for (const s of sessions) s.close();
    expect(messages.map((m) => m.content)).toEqual(["gw-1", "gw-2"]);
    expect(await stored()).toBe(before + 2);
    expect(seen).toEqual([]);
  });

  it("the gateway's user counts its credentials in the quota usage bucket, and touches nothing else of it", async () => {
    const nc = await connectAs("gateway", { inboxPrefix: subjects.inboxPrefix("gateway") });
    const seen = violations(nc);
    const limits = await MeshCredentialLimits.open(nc, subjects, {
      maxConcurrent: 1,
      ratePerS: 100,
      burst: 10,
      holdMs: 60_000,
    });
    const first = await limits.enter("acme", "key-1");
    expect(typeof first).toBe("function");
    // Counted mesh-wide: a second request of the credential finds the one slot taken.
    expect(await limits.enter("acme", "key-1")).toMatchObject({ reason: "concurrency" });
    (first as () => void)();
    expect(seen).toEqual([]);
    // A tenant's quota usage (the resolvers' keys) is neither written nor read by the gateway.
    await expectPublishRefused(nc, `$KV.${subjects.quotaUsageBucket}.acme`);
    await expectPublishRefused(
      nc,
      `$JS.API.DIRECT.GET.KV_${subjects.quotaUsageBucket}.$KV.${subjects.quotaUsageBucket}.acme`,
    );
    await expectPublishRefused(nc, `$JS.API.STREAM.PURGE.KV_${subjects.quotaUsageBucket}`);
  });

  it("the gateway's user reads the calls waiting for approval and never writes them", async () => {
    const nc = await connectAs("gateway", { inboxPrefix: subjects.inboxPrefix("gateway") });
    const seen = violations(nc);
    const approvals = await ApprovalsAtRest.bind(nc, subjects);
    expect(await approvals.waiting(subjects.address("acme", "s-1"), "k-1")).toBeUndefined();
    expect(seen).toEqual([]);
    // Decisions go through the confirm subject, never by writing the bucket.
    await expectPublishRefused(nc, `$KV.${subjects.callApprovalsBucket}.acme.s-1.k-1`);
    await expectPublishRefused(nc, `$JS.API.STREAM.PURGE.KV_${subjects.callApprovalsBucket}`);
  });

  it("another tenant's frontend never sees acme's results", async () => {
    const nc = await connectAs("frontend-globex", {
      inboxPrefix: subjects.frontendInboxPrefix("globex"),
    });
    await expectSubscribeRefused(nc, "toolmesh.v1.sessions.acme.conv-1.>");
    const client = new ToolmeshClient(nc, { tenant: "globex", defaultTimeoutMs: 20_000 });
    const session = client.session("g1");
    expect((await session.submit({ name: "echo", arguments: { text: "g" } }).result).content).toBe(
      "g",
    );
    session.close();
  });

  it("a client set to a tenant its user is not of fails its calls at once, in both subscription modes", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    for (const tenantSubscription of [false, true]) {
      const client = new ToolmeshClient(nc, {
        tenant: "globex",
        tenantSubscription,
        defaultTimeoutMs: 30_000,
      });
      const session = client.session(`wrong-${String(tenantSubscription)}`);
      // Nothing would answer it: without the refusal it would end at its deadline instead.
      const message = await session.submit({ name: "echo", arguments: { text: "x" } }).result;
      expect(message.error).toMatchObject({
        code: "permission_denied",
        retryable: false,
        message: expect.stringContaining(
          "its user may not act for tenant globex or this session (check the client's tenant",
        ),
      });
      // A call submitted after is refused the same way, at once.
      const again = await session.submit({ name: "echo", arguments: { text: "y" } }).result;
      expect(again.error?.code).toBe("permission_denied");
      session.close();
    }
  });

  it("the operator lists tools, and lists and replays a dead letter into a tenant's session", async () => {
    const tools = await runCli(["tools", "list", "--json"], credentials("operator"));
    expect(tools.stderr).toBe("");
    expect(JSON.parse(tools.stdout) as unknown[]).not.toHaveLength(0);
    // A calls-stream letter as the dead-letter keeper writes it, for acme's session dl-1.
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const session = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 }).session(
      "dl-1",
    );
    const callSubject = subjects.call(subjects.address("acme", "dl-1"));
    const h = createHeaders();
    h.set(Header.DlqStream, subjects.streams.calls);
    h.set(Header.DlqSubject, callSubject);
    h.set(Header.DlqSequence, "4242");
    h.set(Header.DlqReason, "max_deliveries");
    h.set(Header.DlqDeliveries, "5");
    const resolver = await connectAs("resolver", { inboxPrefix: subjects.inboxPrefix("resolver") });
    const { seq } = await jetstream(resolver).publish(
      subjects.dlq("echo"),
      encodeJson({
        tool_call: {
          id: "d1",
          type: "function",
          function: { name: "echo", arguments: '{"text":"replayed"}' },
        },
        session_id: "dl-1",
        timeout_ms: 20_000,
      }),
      { headers: h },
    );
    const list = await runCli(["dlq", "list", "--json"], credentials("operator"));
    expect(list.stderr).toBe("");
    expect((JSON.parse(list.stdout) as { seq: number }[]).map((l) => l.seq)).toContain(seq);
    const answered = new Promise<string>((resolve) => {
      session.onEvent((e) => {
        if (e.type === "result" && e.message.tool_call_id === "d1") resolve(e.message.content);
      });
    });
    const replay = await runCli(["dlq", "replay", String(seq), "--json"], credentials("operator"));
    expect(replay.stderr).toBe("");
    expect(JSON.parse(replay.stdout)).toMatchObject({ status: "replayed" });
    expect(await answered).toBe("replayed");
    session.close();
  });

  it("a new tenant joins by a reload; connections of the others are undisturbed", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const events: string[] = [];
    void (async () => {
      for await (const s of nc.status()) events.push(s.type);
    })();
    const acme = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 }).session("r1");
    expect(
      (await acme.submit({ name: "echo", arguments: { text: "before" } }).result).content,
    ).toBe("before");
    await expect(connectAs("frontend-initech")).rejects.toThrow(/authorization/i);
    // Twice: on the first reload the new account's imports are checked against the mesh's
    // exports as they were before it (no export to it yet) and left out; the second binds them
    // (nats-server 2.9.10 and 2.15.1 alike; docs/security.md).
    await server.reload(serverConfig(["acme", "globex", "initech"]));
    await server.reload(serverConfig(["acme", "globex", "initech"]));
    const initech = await connectAs("frontend-initech", {
      inboxPrefix: subjects.frontendInboxPrefix("initech"),
    });
    const session = new ToolmeshClient(initech, {
      tenant: "initech",
      defaultTimeoutMs: 20_000,
    }).session("i1");
    // Without its calls stream, nothing of it is stored: published again until its deadline,
    // then answered `unavailable`.
    const unstored = await session.submit(
      { name: "echo", arguments: { text: "early" } },
      {
        timeoutMs: 1_500,
      },
    ).result;
    expect(unstored.error?.code).toBe("unavailable");
    // Its calls stream, before its first call (docs/security.md#adding-a-tenant-or-a-tool-owner).
    const setup = await runCli(["setup", "--tenants", "initech"], credentials("setup"));
    expect(setup.stderr).toBe("");
    expect(
      (await session.submit({ name: "echo", arguments: { text: "new" } }).result).content,
    ).toBe("new");
    session.close();
    expect((await acme.submit({ name: "echo", arguments: { text: "after" } }).result).content).toBe(
      "after",
    );
    acme.close();
    expect(events.filter((e) => e === "disconnect" || e === "reconnect")).toEqual([]);
  });

  it("refuses an empty --tenant for a frontend's permissions, in one line", async () => {
    const out = await runCli(["--tenant", "", "auth", "permissions", "--role", "frontend"], {});
    expect(out.code).not.toBe(0);
    expect(out.stdout).toBe("");
    expect(out.stderr).toBe(
      "toolmesh: --tenant must not be empty: name the tenant whose frontend this is\n",
    );
  });

  it("grants an owner its namespace with no list, and refuses a name granted twice, in one line", async () => {
    const ok = await runCli(
      ["auth", "config", "--owner", "billing", "--owner", "search=web.*"],
      {},
    );
    expect(ok.code).toBe(0);
    expect(ok.stdout).toContain('"toolmesh.v1.owner.billing.register.billing.*"');
    expect(ok.stdout).toContain('"toolmesh.v1.owner.search.register.web.*"');
    const out = await runCli(
      ["auth", "config", "--owner", "billing", "--owner", "search=billing.charge"],
      {},
    );
    expect(out.code).not.toBe(0);
    expect(out.stdout).toBe("");
    expect(out.stderr).toBe(
      'toolmesh: owners "billing" and "search" are both granted names of registry key billing.charge: a tool name has one owner\n',
    );
  });
});
