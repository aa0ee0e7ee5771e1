import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

interface SetupReport {
  dry_run: boolean;
  changed: number;
  resources: { kind: string; name: string; action: string; changes: { setting?: string }[] }[];
  obsolete?: { kind: string; name: string; action: string }[];
  budget: {
    streams: { stream: string; max_bytes: number; setting: string }[];
    total_bytes: number;
    account_max_bytes: number;
    account_used_bytes: number;
    tenant_results: { max_bytes_each: number; tenants_that_fit: number; tenants_named: number };
  };
}

// Services may read and use streams but neither create nor change them: what `toolmesh setup`
// is for. Executors still create their tools' work consumers.
const PERMISSIONS = `
authorization {
  users = [
    { user: admin, password: admin }
    {
      user: service, password: service,
      permissions: {
        publish: { allow: [">"], deny: ["$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>"] }
        subscribe: { allow: [">"] }
      }
    }
  ]
}
`;

let server: NatsServerHandle;
let admin: Record<string, string>;
let service: Record<string, string>;

async function setup(args: string[], env: Record<string, string> = {}): Promise<SetupReport> {
  const out = await runCli(["setup", "--json", ...args], { ...admin, ...env });
  expect(out.stderr).toBe("");
  expect(out.code).toBe(0);
  return JSON.parse(out.stdout) as SetupReport;
}

beforeAll(async () => {
  server = await startNatsServer({ config: PERMISSIONS });
  admin = {
    NATS_URL: server.url,
    NATS_USER: "admin",
    NATS_PASSWORD: "admin",
    TOOLMESH_PREFIX: "setup",
  };
  service = { ...admin, NATS_USER: "service", NATS_PASSWORD: "service" };
});

afterAll(async () => {
  await killAllServices();
  await server?.stop();
  await stopAll();
});

describe("toolmesh setup", () => {
  it("on a fresh server prints what it would create, creates it, then finds nothing to change", async () => {
    const dry = await setup(["--dry-run"]);
    expect(dry.dry_run).toBe(true);
    expect(dry.resources.map((r) => r.action)).toEqual(dry.resources.map(() => "created"));
    expect(dry.resources.filter((r) => r.kind === "stream")).toHaveLength(6);
    expect(dry.resources.filter((r) => r.kind === "bucket")).toHaveLength(10);
    expect(dry.resources.filter((r) => r.kind === "consumer")).toHaveLength(3);
    // A dry run changed nothing: the real run creates all of it.
    const first = await setup([]);
    expect(first.changed).toBe(19);
    const again = await setup([]);
    expect(again.changed).toBe(0);
    const human = await runCli(["setup"], admin);
    expect(human.stdout).toMatch(/nothing to change: 19 resources match the configuration/);
  });

  it("updates what a changed setting shapes and names the setting", async () => {
    const dry = await setup(["--dry-run"], { TOOLMESH_CALL_RETENTION_MS: "3600000" });
    // The call records and the calls waiting for approval are kept as long.
    expect(dry.changed).toBe(2);
    const buckets = dry.resources.filter((r) => r.action === "updated");
    expect(buckets.map((b) => b.name).sort()).toEqual(["setup_call_approvals", "setup_calls"]);
    for (const bucket of buckets)
      expect(bucket.changes[0]?.setting).toBe("TOOLMESH_CALL_RETENTION_MS");
    expect((await setup([], { TOOLMESH_CALL_RETENTION_MS: "3600000" })).changed).toBe(2);
    expect((await setup([], { TOOLMESH_CALL_RETENTION_MS: "3600000" })).changed).toBe(0);
    // Back to the defaults for the next tests.
    expect((await setup([])).changed).toBe(2);
  });

  it("refuses a tenant or owner id no account can have, in one line, before making anything", async () => {
    for (const [flag, kind] of [
      ["--tenants", "tenant"],
      ["--owners", "owner"],
    ] as const) {
      const out = await runCli(["setup", flag, "ok,a.b"], admin);
      expect(out.code).not.toBe(0);
      expect(out.stdout).toBe("");
      expect(out.stderr).toBe(
        `toolmesh: ${kind} id "a.b" must be 1 to 64 letters, digits, "-" or "_", starting with a letter or digit\n`,
      );
    }
  });

  it("creates an owner's work stream with its max-deliveries advisories kept, and keeps them", async () => {
    const advisory = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SETUP_WORK_acme.*";
    const owned = await setup(["--owners", "acme"]);
    expect(owned.resources.filter((r) => r.action !== "unchanged")).toMatchObject([
      { name: "SETUP_WORK_acme", action: "created" },
      { name: "SETUP_ADVISORIES", action: "updated" },
    ]);
    // Brought up to date without --owners (as the services below check it), the stream keeps it.
    expect((await setup([])).changed).toBe(0);
    const nc = await connect({ servers: server.url, user: "admin", pass: "admin" });
    const info = await (await jetstreamManager(nc)).streams.info("SETUP_ADVISORIES");
    await nc.close();
    expect(info.config.subjects).toEqual([
      "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SETUP_CALLS.*",
      "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SETUP_WORK.*",
      advisory,
    ]);
  });

  it("bounds every stream's bytes by the configured budget and prints it", async () => {
    const env = { TOOLMESH_STORE_BYTES: String(100 * 1024 ** 2), TOOLMESH_MAX_DEAD_LETTERS: "500" };
    const report = await setup(["--owners", "acme"], env);
    const byStream = new Map(report.budget.streams.map((s) => [s.stream, s.max_bytes]));
    expect(byStream.get("SETUP_SESSIONS")).toBe(30 * 1024 ** 2);
    // The call records keep every final message too: the same share (ADR 0050).
    expect(byStream.get("KV_setup_calls")).toBe(30 * 1024 ** 2);
    expect(byStream.get("SETUP_DLQ")).toBe(10 * 1024 ** 2);
    expect(byStream.get("SETUP_WORK_acme")).toBe(256 * 1024 ** 2);
    expect(report.budget.total_bytes).toBe([...byStream.values()].reduce((a, b) => a + b, 0));
    const nc = await connect({ servers: server.url, user: "admin", pass: "admin" });
    try {
      const jsm = await jetstreamManager(nc);
      // What the server holds, not only what setup says: every stream has a byte bound.
      for (const [stream, bytes] of byStream)
        expect((await jsm.streams.info(stream)).config.max_bytes, stream).toBe(bytes);
      const dlq = (await jsm.streams.info("SETUP_DLQ")).config;
      expect(dlq).toMatchObject({ max_msgs: 500, discard: "old" });
    } finally {
      await nc.close();
    }
    const human = await runCli(["setup"], { ...admin, ...env });
    expect(human.stdout).toMatch(
      /budget SETUP_SESSIONS: at most 30\.0 MiB \(TOOLMESH_STORE_BYTES\)/,
    );
    expect(human.stdout).toMatch(
      /budget SETUP_WORK_acme: at most 256\.0 MiB \(TOOLMESH_OWNER_STORE_BYTES\)/,
    );
    expect(human.stdout).toMatch(/budget total: .* of streams \(8\)/);
    // 30 MiB of results hold no tenant at the default 64 MiB: setup says how many fit.
    expect(report.budget.tenant_results).toMatchObject({
      max_bytes_each: 64 * 1024 ** 2,
      tenants_that_fit: 0,
    });
    expect(human.stdout).toMatch(
      /budget results: at most 64\.0 MiB per tenant \(TOOLMESH_TENANT_MAX_STORED_BYTES\); the sessions stream and the call records hold 0 tenants at that bound/,
    );
    // Back to the defaults for the next tests .
    await setup([]);
  });

  it("names the deadline-timers stream of an older version and deletes it only when asked", async () => {
    const nc = await connect({ servers: server.url, user: "admin", pass: "admin" });
    try {
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: "SETUP_TIMERS", subjects: ["setup.v1.timers.>"] });
      const kept = await runCli(["setup"], admin);
      expect(kept.code).toBe(0);
      expect(kept.stdout).toMatch(
        /obsolete stream SETUP_TIMERS: no longer used; .* toolmesh setup --remove-obsolete/,
      );
      expect((await setup([])).obsolete).toEqual([
        { kind: "stream", name: "SETUP_TIMERS", action: "kept" },
      ]);
      expect((await setup(["--dry-run", "--remove-obsolete"])).obsolete?.[0]?.action).toBe("kept");
      expect((await setup(["--remove-obsolete"])).obsolete?.[0]?.action).toBe("deleted");
      await expect(jsm.streams.info("SETUP_TIMERS")).rejects.toThrow(/stream not found/);
      expect((await setup([])).obsolete).toEqual([]);
    } finally {
      await nc.close();
    }
  });

  it("refuses replicas a lone server cannot keep, naming the setting", async () => {
    const out = await runCli(["setup", "--replicas", "3"], admin);
    expect(out.code).toBe(2);
    expect(out.stderr).toMatch(/not part of a cluster; set TOOLMESH_STREAM_REPLICAS=1/);
    expect(out.stderr.trim().split("\n")).toHaveLength(1);
  });
});

describe("services without stream permissions", () => {
  it("start and serve once setup has run", async () => {
    const env = { ...service, TOOLMESH_TOOLS_DIR: fixtureTools("tools-a") };
    await startService("resolver", env);
    await startService("executor", env);
    const out = await runCli(["call", "whoami", "--json"], service);
    expect(out.stderr).toBe("");
    const message = JSON.parse(out.stdout) as { name: string; error?: unknown; content: string };
    expect(message.error).toBeUndefined();
    expect(message.name).toBe("whoami");
    expect(message.content).toMatch(/pid/);
  });

  it("refuse to start when a stream differs, with one line naming the setting and the fix", async () => {
    const run = promisify(execFile);
    const outcome = await run(process.execPath, [join(ROOT, "services/resolver/dist/main.js")], {
      env: { PATH: process.env.PATH ?? "", ...service, TOOLMESH_MAX_QUEUED_CALLS: "500" },
      timeout: 30_000,
    }).then(
      () => ({ code: 0, stderr: "" }),
      (err: { code?: number; stderr?: string }) => ({ code: err.code, stderr: err.stderr ?? "" }),
    );
    expect(outcome.code).toBe(1);
    const lines = outcome.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/stream SETUP_CALLS differs from the configuration/);
    expect(lines[0]).toMatch(/TOOLMESH_MAX_QUEUED_CALLS/);
    expect(lines[0]).toMatch(/run `toolmesh setup`/);
  });
});
