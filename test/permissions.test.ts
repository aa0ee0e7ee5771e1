import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { PermissionViolationError } from "@nats-io/nats-core";
import { renderAccountConfig, rolePermissions } from "@toolmesh/cli";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import type { NatsConnectOptions } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { killAllServices, startService, type ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// The whole mesh under the permissions `toolmesh auth config` generates (the code the shipped
// deploy/nats/toolmesh.conf is checked against), on a server that requires TLS client
// certificates: every role is its own NATS user with the least rights, and what a frontend
// must not do is refused by the server itself.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const subjects = createSubjects();
const PASSWORDS: Record<string, string> = {};

let pki: TestPki;
let server: NatsServerHandle;
let work: string;
const open: NatsConnection[] = [];
let services: ServiceProcess[] = [];

function password(user: string): string {
  return (PASSWORDS[user] ??= `pw-${user}-${Math.random().toString(36).slice(2)}`);
}

function credentials(user: string): Record<string, string> {
  return {
    NATS_URL: server.url,
    NATS_USER: user,
    NATS_PASSWORD: password(user),
    NATS_CA: pki.caFile,
    NATS_CERT: pki.clientCert,
    NATS_KEY: pki.clientKey,
  };
}

async function connectAs(user: string, extra: NatsConnectOptions = {}): Promise<NatsConnection> {
  const nc = await connectNats({
    servers: server.url,
    user,
    password: password(user),
    tlsCa: pki.caFile,
    tlsCert: pki.clientCert,
    tlsKey: pki.clientKey,
    ...extra,
  });
  open.push(nc);
  return nc;
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

/** Lets the status listeners see what arrived before the flush's PONG. */
function settled(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * Publishes to each subject and expects the server to refuse every one. The server answers a
 * violation before the PONG of the flush that follows, so no waiting is needed.
 */
async function expectPublishRefused(nc: NatsConnection, subject: string): Promise<void> {
  const seen = violations(nc);
  nc.publish(subject, "{}", { reply: `${subjects.frontendInboxPrefix("acme")}.x` });
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
  work = await mkdtemp(join(tmpdir(), "toolmesh-perm-"));
  const mcpDir = join(work, "mcp");
  await mkdir(mcpDir);
  await writeFile(
    join(mcpDir, "fx.yaml"),
    [
      "name: fx",
      "transport: stdio",
      `command: ${JSON.stringify(process.execPath)}`,
      `args: [${JSON.stringify(join(ROOT, "test", "fixtures", "mcp", "test-server.mjs"))}]`,
    ].join("\n"),
  );
  const config = renderAccountConfig({
    tenants: ["acme", "globex"],
    extraUsers: [
      {
        user: "frontend-acme-s1",
        permissions: rolePermissions("frontend", { tenant: "acme", session: "s1" }),
      },
      { user: "executor-rogue", permissions: rolePermissions("executor", { tools: ["rogue"] }) },
    ],
  });
  // The configuration reads passwords from the environment, as the shipped file does.
  const users = [...config.matchAll(/password: \$(\w+)/g)].map((m) => m[1]!);
  for (const variable of users) {
    const user = variable
      .replace(/^TOOLMESH_|_PASSWORD$/g, "")
      .toLowerCase()
      .replace(/_/g, "-");
    process.env[variable] = password(user);
  }
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup"], credentials("setup"));
  expect(setup.stderr).toBe("");
  expect(setup.code).toBe(0);
  const env = (user: string) => ({ ...credentials(user), TOOLMESH_ACK_WAIT_MS: "2000" });
  services = await Promise.all([
    startService("resolver", env("resolver")),
    startService("executor", { ...env("executor"), TOOLMESH_TOOLS_DIR: "tools/builtin" }),
    startService("schema-expander", env("schema-expander")),
    startService("mcp-bridge", { ...env("mcp-bridge"), TOOLMESH_MCP_DIR: mcpDir }),
  ]);
});

afterAll(async () => {
  for (const nc of open) await nc.close().catch(() => undefined);
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
  await rm(work, { recursive: true, force: true });
});

describe("the mesh under least-privilege users and TLS", () => {
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

  it("works end to end: builtin and MCP tools, schema expansion, catalog, cancel", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 20_000 });
    const session = client.session("conv-1");
    const echo = await session.submit({ name: "echo", arguments: { text: "hi" } }).result;
    expect(echo.error).toBeUndefined();
    expect(echo.content).toBe("hi");
    await expect
      .poll(async () => (await client.catalog()).tools.map((t) => t.name))
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
    session.close();
    // Nothing any service did was refused: each role's rights are enough.
    for (const service of services) {
      expect(JSON.stringify(service.lines) + service.stderr()).not.toMatch(/permission/i);
    }
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
  });

  it("a frontend cannot reach work, control, other tenants, call records, consumers or inboxes, nor forge a result", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    // What it may do is not reported, so a report below is a refusal.
    const allowed = violations(nc);
    nc.subscribe("toolmesh.v1.sessions.acme.conv-9.>");
    nc.publish("toolmesh.v1.rpc.acme.catalog", "{}");
    await nc.flush();
    await settled();
    expect(allowed).toEqual([]);
    for (const subject of [
      "toolmesh.v1.work.echo",
      "toolmesh.v1.control.abort",
      "toolmesh.v1.calls.globex.s1",
      "toolmesh.v1.cancel.globex.s1",
      "toolmesh.v1.rpc.globex.catalog",
      // forged results and schemas, even for its own sessions
      "toolmesh.v1.sessions.acme.conv-1.result.c1",
      "toolmesh.v1.sessions.globex.s1.result.c1",
      "toolmesh.v1.sessions.acme.conv-1.schema.echo",
      // other sessions' stored results, call records, the registry, the groups
      "$JS.API.DIRECT.GET.TOOLMESH_SESSIONS.toolmesh.v1.sessions.globex.s1.result.c1",
      "$JS.API.STREAM.MSG.GET.TOOLMESH_SESSIONS",
      "$JS.API.STREAM.MSG.GET.KV_toolmesh_calls",
      "$JS.API.DIRECT.GET.KV_toolmesh_calls.$KV.toolmesh_calls.x",
      "$KV.toolmesh_calls.x",
      "$KV.toolmesh_tools.echo",
      "$KV.toolmesh_groups.acme",
      // consumers on the work streams, stealing a tool's work
      "$JS.API.CONSUMER.CREATE.TOOLMESH_WORK.thief.toolmesh.v1.work.echo",
      "$JS.API.CONSUMER.DURABLE.CREATE.TOOLMESH_WORK.thief",
      "$JS.API.CONSUMER.MSG.NEXT.TOOLMESH_WORK.work_echo",
      "$JS.API.CONSUMER.CREATE.TOOLMESH_CALLS",
      "$JS.API.STREAM.DELETE.TOOLMESH_CALLS",
      "$JS.API.STREAM.PURGE.TOOLMESH_SESSIONS",
    ]) {
      await expectPublishRefused(nc, subject);
    }
    for (const subject of [
      "toolmesh.v1.sessions.globex.>",
      "toolmesh.v1.sessions.>",
      "toolmesh.v1.calls.>",
      "toolmesh.v1.work.>",
      "toolmesh.v1.control.abort",
      "_INBOX.>",
      "_INBOX.toolmesh.resolver.>",
      "_INBOX.toolmesh.executor.>",
      "_INBOX.toolmesh.frontend.globex.>",
      "$KV.toolmesh_calls.>",
    ]) {
      await expectSubscribeRefused(nc, subject);
    }
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

  it("an executor may register only the tool names it owns", async () => {
    const nc = await connectAs("executor-rogue", {
      inboxPrefix: subjects.inboxPrefix("executor-rogue"),
    });
    await expectPublishRefused(nc, "$KV.toolmesh_tools.echo");
    await expectPublishRefused(nc, "$KV.toolmesh_tools.fx.echo");
    await expectSubscribeRefused(nc, "toolmesh.v1.calls.>");
  });

  it("the operator lists tools and dead letters", async () => {
    const tools = await runCli(["tools", "list", "--json"], credentials("operator"));
    expect(tools.stderr).toBe("");
    expect(JSON.parse(tools.stdout) as unknown[]).not.toHaveLength(0);
    const dlq = await runCli(["dlq", "list", "--json"], credentials("operator"));
    expect(dlq.stderr).toBe("");
    expect(dlq.code).toBe(0);
  });
});
