import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { MESH_ACCOUNT, renderAccountConfig, tenantAccount } from "@toolmesh/nats";
import { ToolmeshClient } from "@toolmesh/client";
import { createSubjects, encodeJson } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// A tenant's approver reads its own tenant's audit trail from the tenant's account (docs/audit.md),
// in the accounts layout `toolmesh auth config` generates (with TLS): with the CLI it tails,
// verifies and exports what the operator reads. Attacked: another tenant's approver, the
// tenant's frontend, and a principal with every right in the tenant's account reach for the
// other tenant's trail, and for more than the two reads on its own.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const START_MS = 120_000;
const ACME_TRAIL = subjects.auditStream("acme");
const GLOBEX_TRAIL = subjects.auditStream("globex");

let pki: TestPki;
let server: NatsServerHandle;
let ledgerDir: string;
const { password, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

beforeAll(async () => {
  pki = await createTestPki();
  ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-audit-tenant-"));
  const config = renderAccountConfig({
    tenants: ["acme", "globex"],
    extraUsers: [
      // Every right inside acme's account: the account's imports alone bound it.
      {
        account: tenantAccount("acme"),
        user: "acme-root",
        permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } },
      },
      {
        account: MESH_ACCOUNT,
        user: "observer",
        permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } },
      },
    ],
  });
  for (const m of config.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g))
    process.env[m[2]!] = password(m[1]!);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup", "--tenants", "acme,globex"], credentials("setup"));
  expect(setup.stderr).toBe("");
  const env = (user: string) => ({ ...credentials(user), TOOLMESH_AUDIT: "required" });
  await Promise.all([
    startService("resolver", env("resolver"), START_MS),
    startService(
      "executor",
      {
        ...env("executor"),
        TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
        TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
      },
      START_MS,
    ),
  ]);
  for (const tenant of ["acme", "globex"]) {
    const nc = await connectAs(`frontend-${tenant}`, {
      inboxPrefix: subjects.frontendInboxPrefix(tenant),
    });
    const session = new ToolmeshClient(nc, { tenant, defaultTimeoutMs: 30_000 }).session("s1");
    for (const id of ["c1", "c2"]) {
      const done = await session.submit({ id, name: "sleepy", arguments: { ms: 5 } }).result;
      expect(done.error).toBeUndefined();
    }
    session.close();
  }
}, 3 * START_MS);

afterAll(async () => {
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
  if (ledgerDir !== undefined) await rm(ledgerDir, { recursive: true, force: true });
});

/** `toolmesh --tenant T audit …` as `user` (an approver user acts `--as approver`). */
function auditAs(user: string, tenant: string, ...args: string[]) {
  const as = user.startsWith("approver-") ? ["--as", "approver"] : [];
  return runCli(["--tenant", tenant, "audit", ...args, ...as], credentials(user));
}

const lines = (stdout: string): string[] => stdout.split("\n").filter(Boolean);

/**
 * Whether `subject` gets the trail's own answer (a stored event, or the stream's info): an
 * account without JetStream answers the rest of the API itself, and a denied subject gets
 * nothing.
 */
async function reaches(nc: NatsConnection, subject: string): Promise<boolean> {
  try {
    const m = await nc.request(subject, encodeJson({ seq: 1 }), { timeout: 2_000 });
    return (m.headers?.get("Nats-Stream") ?? "") !== "" || m.string().includes('"config":{');
  } catch {
    return false;
  }
}

describe("a tenant's approver and its tenant's audit trail", () => {
  it("tails, verifies and exports it as the operator reads it", async () => {
    const operator = await auditAs("operator", "acme", "tail", "--json");
    expect(operator).toMatchObject({ code: 0, stderr: "" });
    const events = lines(operator.stdout);
    // Each of the two calls: at least admitted, an attempt, and its end.
    expect(events.length).toBeGreaterThanOrEqual(6);
    expect(events.map((e) => (JSON.parse(e) as { call_id?: string }).call_id)).toContain("c2");

    const tail = await auditAs("approver-acme", "acme", "tail", "--json");
    expect(tail).toMatchObject({ code: 0, stderr: "" });
    expect(lines(tail.stdout)).toEqual(events);
    const one = await auditAs("approver-acme", "acme", "tail", "--json", "--call", "c1");
    expect(lines(one.stdout).length).toBeGreaterThan(0);
    expect(lines(one.stdout).every((e) => e.includes('"call_id":"c1"'))).toBe(true);

    const verify = await auditAs("approver-acme", "acme", "verify");
    expect(verify).toMatchObject({ code: 0, stdout: `verified ${events.length} events\n` });
    const since = await auditAs("approver-acme", "acme", "verify", "--since", "1h");
    expect(since).toMatchObject({ code: 0, stdout: `verified ${events.length} events\n` });
    const exported = await auditAs("approver-acme", "acme", "export", "--since", "1h");
    expect(lines(exported.stdout)).toEqual(events);
    // Events stored before a start time are left out: none of the last hour's is that old.
    const recent = await auditAs("approver-acme", "acme", "export", "--since", "1s");
    expect(lines(recent.stdout)).toEqual([]);
  });

  it("is not another tenant's approver's to read, nor its own approver's to read otherwise", async () => {
    for (const [user, tenant] of [
      ["approver-globex", "acme"],
      ["approver-acme", "globex"],
    ] as const) {
      const out = await auditAs(user, tenant, "tail", "--json");
      expect(out.code).not.toBe(0);
      expect(out.stdout).toBe("");
      expect(lines(out.stderr)).toHaveLength(1);
    }
    // Its own trail by no other request than direct gets: no consumer, no stream info or
    // stored-message get, no delete; and no other tenant's.
    const approver = await connectAs("approver-acme", {
      inboxPrefix: subjects.approverInboxPrefix("acme"),
    });
    expect(await reaches(approver, `$JS.API.DIRECT.GET.${ACME_TRAIL}`)).toBe(true);
    for (const subject of [
      `$JS.API.CONSUMER.CREATE.${ACME_TRAIL}`,
      `$JS.API.STREAM.INFO.${ACME_TRAIL}`,
      `$JS.API.STREAM.MSG.GET.${ACME_TRAIL}`,
      `$JS.API.STREAM.MSG.DELETE.${ACME_TRAIL}`,
      `$JS.API.DIRECT.GET.${GLOBEX_TRAIL}`,
    ])
      expect(await reaches(approver, subject), subject).toBe(false);
  });

  it("is not the tenant's frontend's, and its account reaches no other tenant's", async () => {
    const frontend = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    for (const subject of [`$JS.API.DIRECT.GET.${ACME_TRAIL}`, `$JS.API.STREAM.INFO.${ACME_TRAIL}`])
      expect(await reaches(frontend, subject), subject).toBe(false);
    // Every right in acme's account: acme's own trail crosses (control), globex's does not.
    const root = await connectAs("acme-root");
    expect(await reaches(root, `$JS.API.DIRECT.GET.${ACME_TRAIL}`)).toBe(true);
    for (const subject of [
      `$JS.API.DIRECT.GET.${GLOBEX_TRAIL}`,
      `$JS.API.STREAM.INFO.${GLOBEX_TRAIL}`,
      `$JS.API.STREAM.INFO.${ACME_TRAIL}`,
    ])
      expect(await reaches(root, subject), subject).toBe(false);
  });
});
