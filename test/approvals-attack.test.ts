import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { MESH_ACCOUNT, renderAccountConfig, tenantAccount } from "@toolmesh/nats";
import { ToolmeshClient } from "@toolmesh/client";
import type { ApprovalEntry, ToolMessage } from "@toolmesh/protocol";
import { callKey, createSubjects, encodeJson } from "@toolmesh/protocol";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { readTrail } from "@toolmesh/audit";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers, everyRight } from "./helpers/account-users.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";
import { eventually, until } from "./helpers/eventually.js";

// The approver role attacked, in the accounts layout `toolmesh auth config` generates (with
// TLS): another tenant's approver, the tenant's own frontend and a principal with every right in
// the tenant's account try to see and decide a waiting call, directly and through reply
// subjects pointed at the approvals bucket and the JetStream API. Only the tenant's approver
// (and the operator) decide it, once. The same principals reach for the tenant's audit trail,
// which its approver alone reads (docs/audit.md), and for the other tenant's.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
const START_MS = 120_000;
const ACME_TRAIL = subjects.auditStream("acme");
const GLOBEX_TRAIL = subjects.auditStream("globex");
const POLICY = `@id("all")
permit (principal, action, resource);

@id("danger")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"sleepy")
when { context.args has tag && context.args.tag == "danger" };
`;

let pki: TestPki;
let server: NatsServerHandle;
let ledgerDir: string;
let mesh: NatsConnection;
let resolver: ServiceProcess;
const { exportPasswords, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

beforeAll(async () => {
  pki = await createTestPki();
  ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-approvals-attack-"));
  const config = renderAccountConfig({
    tenants: ["acme", "globex"],
    extraUsers: [
      // Every right inside acme's account: the account's imports alone bound it.
      everyRight(tenantAccount("acme"), "acme-root"),
      everyRight(MESH_ACCOUNT, "observer"),
    ],
  });
  exportPasswords(config);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup", "--tenants", "acme,globex"], credentials("setup"));
  expect(setup.stderr).toBe("");
  const env = (user: string) => ({
    ...credentials(user),
    TOOLMESH_ACK_WAIT_MS: "2000",
    TOOLMESH_AUDIT: "required",
  });
  [resolver] = await Promise.all([
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
  mesh = await connectAs("observer");
  const store = new PolicyStore(await openPolicyBucket(mesh, { subjects }));
  const { revision } = await store.set(POLICY);
  await resolver.waitForLog(
    (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
  );
}, 3 * START_MS);

afterAll(async () => {
  await mesh?.close();
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
  if (ledgerDir !== undefined) await rm(ledgerDir, { recursive: true, force: true });
});

async function runs(callId: string): Promise<number> {
  let lines = 0;
  for (const file of await readdir(ledgerDir)) {
    if (!decodeURIComponent(file).endsWith(`/${callId}`)) continue;
    lines += (await readFile(join(ledgerDir, file), "utf8")).split("\n").filter(Boolean).length;
  }
  return lines;
}

/** `toolmesh approvals …` as `user`, for tenant `tenant`. */
function approvalsAs(user: string, tenant: string, ...args: string[]) {
  const as = user.startsWith("approver-") ? ["--as", "approver"] : [];
  return runCli(["--tenant", tenant, "approvals", ...args, ...as], credentials(user));
}

async function listedBy(user: string, tenant: string): Promise<ApprovalEntry[] | undefined> {
  const out = await approvalsAs(user, tenant, "list", "--json");
  return out.code === 0 ? (JSON.parse(out.stdout) as ApprovalEntry[]) : undefined;
}

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

describe("approvers in their tenants' accounts, attacked", () => {
  it("only the tenant's approver sees and decides its waiting call, once", async () => {
    const nc = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const client = new ToolmeshClient(nc, { tenant: "acme", defaultTimeoutMs: 30_000 });
    const session = client.session("s-attack");
    const { result } = session.submit({
      id: "victim",
      name: "sleepy",
      arguments: { ms: 5, tag: "danger" },
    });
    const entry = await eventually("the waiting call listed by acme's approver", async () =>
      (await listedBy("approver-acme", "acme"))?.find((e) => e.call_id === "victim"),
    );
    expect(entry).toMatchObject({ tenant: "acme", tool: "sleepy" });
    const approvals = await new Kvm(mesh).open(subjects.callApprovalsBucket);
    const before = (await approvals.status()).values;

    // globex's approver: its own tenant holds no such call; acme's subject is not its to use.
    expect(await listedBy("approver-globex", "globex")).toEqual([]);
    expect((await approvalsAs("approver-globex", "globex", "approve", "victim")).code).toBe(1);
    expect((await approvalsAs("approver-globex", "acme", "list", "--json")).code).not.toBe(0);
    expect((await approvalsAs("approver-globex", "acme", "approve", "victim")).code).not.toBe(0);
    // acme's plain frontend may neither list nor approve, nor confirm an operator's call as its caller.
    const asFrontend = await runCli(
      ["--tenant", "acme", "approvals", "approve", "victim"],
      credentials("frontend-acme"),
    );
    expect(asFrontend.code).not.toBe(0);
    expect((await session.confirm("victim", true)).ok).toBe(false);

    // Straight at the bucket and through reply subjects pointed at it and at the JetStream API,
    // from every principal of the tenants' accounts.
    const forged = encodeJson({ state: "approved" });
    const key = callKey(subjects.address("acme", "s-attack"), "s-attack/victim");
    for (const user of ["approver-globex", "approver-acme", "frontend-acme", "acme-root"]) {
      const attacker = await connectAs(user, {
        inboxPrefix: user.startsWith("approver-")
          ? subjects.approverInboxPrefix(user.slice("approver-".length))
          : subjects.frontendInboxPrefix("acme"),
      });
      attacker.publish(`$KV.${subjects.callApprovalsBucket}.${key}`, forged);
      attacker.publish(`$KV.${subjects.callApprovalsBucket}.acme.>`, forged);
      for (const reply of [
        `$KV.${subjects.callApprovalsBucket}.acme.s-attack.x`,
        `$JS.API.STREAM.DELETE.KV_${subjects.callApprovalsBucket}`,
        `$JS.API.STREAM.PURGE.KV_${subjects.callApprovalsBucket}`,
      ]) {
        for (const tenant of ["acme", "globex"])
          attacker.publish(subjects.approvalsRpc(tenant), encodeJson({ op: "list" }), { reply });
        attacker.publish(
          subjects.confirm({ tenant: "acme", session: "s-attack" }),
          encodeJson({}),
          {
            reply,
          },
        );
      }
      await attacker.flush();
      await attacker.close();
    }
    await mesh.flush();
    const status = await approvals.status();
    expect(status.values).toBe(before);
    const stored = await approvals.get(key);
    expect(stored === null ? undefined : JSON.parse(stored.string()).state).toBe("waiting");
    expect(await runs("victim")).toBe(0);

    // acme's approver decides it: it runs once, and a second decision is refused.
    expect((await approvalsAs("approver-acme", "acme", "approve", "victim")).code).toBe(0);
    const done: ToolMessage = await result;
    expect(done.error).toBeUndefined();
    expect((await approvalsAs("approver-acme", "acme", "approve", "victim")).code).toBe(1);
    expect(await runs("victim")).toBe(1);
    session.close();
    // A dozen CLI processes (a Node start each): minutes on a loaded machine, never a hang.
  }, 180_000);
});

describe("a tenant's approver and its tenant's audit trail", () => {
  beforeAll(async () => {
    for (const tenant of ["acme", "globex"]) {
      const nc = await connectAs(`frontend-${tenant}`, {
        inboxPrefix: subjects.frontendInboxPrefix(tenant),
      });
      const client = new ToolmeshClient(nc, { tenant, defaultTimeoutMs: 30_000 });
      const session = client.session("s-trail");
      for (const id of ["c1", "c2"]) {
        const done = await session.submit({ id, name: "sleepy", arguments: { ms: 5 } }).result;
        expect(done.error).toBeUndefined();
      }
      session.close();
    }
    // The executor hands its events to the resolver, which writes them at once: within
    // seconds every call's end is in acme's trail (an unanswered hand-on retries after 3 s).
    await until(
      "every call's end in acme's trail",
      async () => {
        const ended = new Set<string>();
        for await (const { record } of readTrail(mesh, subjects, "acme")) {
          const event = record as { type?: string; call_id?: string };
          if (event.type === "call.ended" && event.call_id !== undefined) ended.add(event.call_id);
        }
        return ["c1", "c2"].every((id) => ended.has(id));
      },
      { timeoutMs: 2_500 },
    );
  }, START_MS);

  it("tails, verifies and exports it as the operator reads it", async () => {
    const operator = await auditAs("operator", "acme", "tail", "--json");
    expect(operator).toMatchObject({ code: 0, stderr: "" });
    const events = lines(operator.stdout);
    // Each call: at least admitted, an attempt, and its end.
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
