import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { CEDAR_SCHEMA, CompiledPolicySet, PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { eventually } from "./helpers/eventually.js";
import { mcpClient, startGateway } from "./helpers/gateway.js";

// The worked examples of docs/policy.md, as written there, through a real mesh: three
// resolvers, an executor and a schema expander, sets stored with the CLI.

let server: NatsServerHandle;
let nc: NatsConnection;
let env: Record<string, string>;
let dir: string;
let store: PolicyStore;
const resolvers: ServiceProcess[] = [];
let expander: ServiceProcess;
let blocks: string[];
let gatewayUrl: string;

beforeAll(async () => {
  server = await startNatsServer();
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-policy"),
    TOOLMESH_CONFIG_DIR: fixtureTools("configs-policy"),
  };
  for (let i = 0; i < 3; i++) resolvers.push(await startService("resolver", env));
  expander = await startService("schema-expander", env);
  await startService("executor", env);
  // The gateway serves tenant acme to MCP clients: its tools/list is the catalog.
  gatewayUrl = (await startGateway({ ...env, TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "acme" })).url;
  await Promise.all(
    resolvers.map((r) => toolAvailable(r, "read_file", "delete_file", "purge_cache")),
  );
  nc = await connect({ servers: server.url });
  store = new PolicyStore(await openPolicyBucket(nc, { subjects: createSubjects() }));
  dir = await mkdtemp(join(tmpdir(), "toolmesh-policy-"));
  const doc = await readFile(new URL("../docs/policy.md", import.meta.url), "utf8");
  blocks = [...doc.matchAll(/```cedar\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
}, 90_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

afterEach(async () => {
  for (const args of [["--operator"], ["--tenant", "acme"]]) {
    const before = await store.get(args[0] === "--operator" ? undefined : "acme");
    if (before === undefined) continue;
    const key = args[0] === "--operator" ? "operator" : "tenant.acme";
    const marks = watchers().map((w) => w.lines.length);
    expect((await runCli(["policy", "rm", ...args], env)).code).toBe(0);
    await applied(key, undefined, marks);
  }
});

function watchers(): ServiceProcess[] {
  return [...resolvers, expander];
}

/** Waits until every resolver and the schema expander applied `key` (at `revision`). */
async function applied(key: string, revision: number | undefined, marks: number[]) {
  await Promise.all(
    watchers().map((w, i) =>
      w.waitForLog(
        (l) =>
          l.msg === "policy set applied" &&
          l.key === key &&
          (revision === undefined || l.revision === revision) &&
          w.lines.indexOf(l) >= (marks[i] ?? 0),
      ),
    ),
  );
}

/** Stores a set with `toolmesh policy set` and waits until it is in force everywhere. */
async function setPolicy(text: string, tenant?: string): Promise<number> {
  const file = join(dir, `${tenant ?? "operator"}-${Date.now()}.cedar`);
  await writeFile(file, text);
  const marks = watchers().map((w) => w.lines.length);
  const out = await runCli(
    ["policy", "set", file, "--json", ...(tenant === undefined ? [] : ["--tenant", tenant])],
    env,
  );
  expect(out.stderr).toBe("");
  expect(out.code).toBe(0);
  const { revision } = JSON.parse(out.stdout) as { revision: number };
  await applied(tenant === undefined ? "operator" : `tenant.${tenant}`, revision, marks);
  return revision;
}

let seq = 0;
async function call(
  tenant: string,
  name: string,
  args: Record<string, unknown>,
  agent?: string,
): Promise<ToolMessage> {
  const client = new ToolmeshClient(nc, { tenant });
  const session = client.session(`s-${++seq}`);
  const result = await session.submit(
    { name, arguments: args },
    agent === undefined ? {} : { agent },
  ).result;
  session.close();
  return result;
}

async function listed(tenant: string, agent?: string): Promise<string[]> {
  const catalog = await new ToolmeshClient(nc, { tenant }).catalog(
    agent === undefined ? {} : { agent },
  );
  return catalog.tools.map((t) => t.name).sort();
}

function allowed(m: ToolMessage): void {
  expect(m.error).toBeUndefined();
}

function refused(m: ToolMessage, policies: string[]): void {
  expect(m.error?.code).toBe("permission_denied");
  expect(m.error?.details?.policies).toEqual(policies);
  // The decision, never the policy text.
  expect(m.error?.message).not.toMatch(/permit \(|forbid \(|context\./);
}

describe("policies (docs/policy.md)", () => {
  it("documents the schema the sets are validated against", () => {
    expect(blocks[0]).toBe(CEDAR_SCHEMA);
  });

  it("with no policy set, every tool is open and listed", async () => {
    allowed(await call("acme", "delete_file", { path: "/etc/passwd" }));
    expect(await listed("acme")).toEqual(["delete_file", "purge_cache", "read_file"]);
  });

  it("read-only tools for one agent", async () => {
    await setPolicy(blocks[1]!);
    const ok = await call("acme", "read_file", { path: "/tmp/a" }, "reader");
    allowed(ok);
    expect(ok.content).toBe("read /tmp/a");
    refused(await call("acme", "delete_file", { path: "/tmp/a" }, "reader"), []);
    refused(await call("acme", "read_file", { path: "/tmp/a" }), []);
    expect(await listed("acme", "reader")).toEqual(["read_file"]);
    expect(await listed("acme")).toEqual([]);
  });

  it("a destructive tool refused when an argument matches", async () => {
    await setPolicy(blocks[2]!);
    const ok = await call("acme", "delete_file", { path: "/tmp/x" });
    allowed(ok);
    expect(ok.content).toBe("deleted /tmp/x");
    refused(await call("acme", "delete_file", { path: "/etc/passwd" }), ["operator:no-etc"]);
    refused(await call("acme", "delete_file", { path: "/tmp/x", force: true }), [
      "operator:no-force",
    ]);
    expect(await listed("acme")).toEqual(["delete_file", "purge_cache", "read_file"]);
  });

  it("a destructive tool that waits for an operator's approval when an argument matches", async () => {
    await setPolicy(blocks[5]!);
    allowed(await call("acme", "delete_file", { path: "/tmp/x" }));
    const client = new ToolmeshClient(nc, { tenant: "acme" });
    const session = client.session(`s-${++seq}`);
    const waiting = session.submit({
      id: "srv-1",
      name: "delete_file",
      arguments: { path: "/srv/data" },
    });
    const list = async () =>
      JSON.parse(
        (await runCli(["--tenant", "acme", "approvals", "list", "--json"], env)).stdout,
      ) as { call_id: string; args: unknown; expires_at: number; requested_at: number }[];
    const entry = await eventually("the call listed as waiting", async () =>
      (await list()).find((e) => e.call_id === "srv-1"),
    );
    expect(entry.args).toEqual({ path: "/srv/data", force: false });
    expect(entry.expires_at - entry.requested_at).toBe(3_600_000);
    expect(await listed("acme")).toContain("delete_file");
    expect((await runCli(["--tenant", "acme", "approvals", "approve", "srv-1"], env)).code).toBe(0);
    allowed(await waiting.result);
    session.close();
  });

  it("a tenant narrowing the operator's set", async () => {
    await setPolicy(blocks[3]!);
    await setPolicy(blocks[4]!, "acme");
    refused(await call("acme", "delete_file", { path: "/tmp/x" }), ["tenant:acme-no-destructive"]);
    allowed(await call("globex", "delete_file", { path: "/tmp/x" }));
    allowed(await call("acme", "read_file", { path: "/tmp/x" }));
    refused(await call("acme", "purge_cache", {}), []);
    expect(await listed("acme")).toEqual(["read_file"]);
    expect(await listed("globex")).toEqual(["delete_file", "read_file"]);

    // Through the gateway, tools/list and tools/call agree with the catalog.
    const mcp = await mcpClient(gatewayUrl, undefined);
    expect((await mcp.listTools()).tools.map((t) => t.name)).toEqual(["read_file"]);
    const denied = await mcp.callTool({ name: "delete_file", arguments: { path: "/tmp/x" } });
    expect(denied.isError).toBe(true);
    expect(JSON.stringify(denied.content)).toContain(
      'refused by policy \\"tenant:acme-no-destructive\\"',
    );
    const read = await mcp.callTool({ name: "read_file", arguments: { path: "/tmp/x" } });
    expect(read.isError).not.toBe(true);
    await mcp.close();

    const check = await runCli(
      [
        "policy",
        "check",
        "--tool",
        "delete_file",
        "--args",
        '{"path":"/tmp/x"}',
        "--tenant",
        "acme",
        "--json",
      ],
      env,
    );
    expect(check.code).toBe(1);
    expect(JSON.parse(check.stdout)).toMatchObject({
      call: { allowed: false, policies: ["tenant:acme-no-destructive"] },
      listed: false,
    });
  });

  it("refuses a bad file with line and column and changes nothing", async () => {
    const revision = await setPolicy(blocks[2]!);
    const file = join(dir, "bad.cedar");
    await writeFile(
      file,
      `@id("a")\npermit (principal, action, resource)\n  when { resource.colour == "red" };\n`,
    );
    const out = await runCli(["policy", "set", file], env);
    expect(out.code).toBe(1);
    expect(out.stdout).toMatch(new RegExp(`${file}:3:\\d+: policy "a": .*colour`));
    expect((await store.get())?.revision).toBe(revision);
    refused(await call("acme", "delete_file", { path: "/etc/passwd" }), ["operator:no-etc"]);
  });

  it("a stored set that does not compile (written past the CLI) permits nothing until replaced", async () => {
    const marks = watchers().map((w) => w.lines.length);
    const kv = await openPolicyBucket(nc, { subjects: createSubjects() });
    const revision = await kv.put("operator", "permit (principal, action, resource"); // unfinished
    await applied("operator", revision, marks);
    refused(await call("acme", "read_file", { path: "/tmp/a" }), []);
    expect(await listed("acme")).toEqual([]);
    expect(
      resolvers[0]!.lines.some(
        (l) =>
          l.msg ===
          "stored policy set is invalid; nothing is permitted under it until it is replaced",
      ),
    ).toBe(true);
  });

  it("a change is applied by three resolvers within a second", async () => {
    // Validated here first, as `policy set` does, then timed from the write.
    CompiledPolicySet.compile(blocks[1]!);
    const kv = await openPolicyBucket(nc, { subjects: createSubjects() });
    const marks = watchers().map((w) => w.lines.length);
    const before = Date.now();
    const stored = { revision: await kv.put("operator", blocks[1]!) };
    await applied("operator", stored.revision, marks);
    for (const [i, r] of resolvers.entries()) {
      const line = r.lines.find(
        (l, at) =>
          at >= (marks[i] ?? 0) && l.msg === "policy set applied" && l.revision === stored.revision,
      );
      expect(Date.parse(String(line?.time)) - before).toBeLessThan(1_000);
    }
  });

  it("replays recorded calls against a candidate set and prints what would change", async () => {
    allowed(await call("acme", "read_file", { path: "/tmp/r" }));
    allowed(await call("acme", "delete_file", { path: "/tmp/r" }));
    const file = join(dir, "candidate.cedar");
    await writeFile(file, blocks[1]!);
    const out = await runCli(["policy", "replay", file, "--tenant", "acme", "--json"], env);
    expect(out.code).toBe(0);
    const lines = out.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const summary = lines.pop();
    const changes = lines.filter((l) => l.tool === "delete_file" || l.tool === "read_file");
    // No set: everything allowed. Candidate: no agent → nothing allowed.
    expect(changes.length).toBeGreaterThanOrEqual(2);
    for (const c of changes)
      expect(c).toMatchObject({
        before: "allow (no policy set)",
        after: expect.stringMatching(/^deny/),
      });
    expect(summary).toMatchObject({ changed: lines.length });
    // Every tenant's calls: the bucket's other keys (the resolvers' clock probe) are passed over.
    const all = await runCli(["policy", "replay", file, "--json"], env);
    expect(all).toMatchObject({ code: 0, stderr: "" });
    expect(all.stdout).toContain('"tool":"delete_file"');
  });
});
