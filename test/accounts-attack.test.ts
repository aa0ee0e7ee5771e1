import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import type { JetStreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import {
  MESH_ACCOUNT,
  ensureConsumer,
  renderAccountConfig,
  rolePermissions,
  tenantAccount,
} from "@toolmesh/nats";
import { auditEndsConsumerSpec } from "@toolmesh/audit";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import { ErrorCode, createSubjects } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, startService } from "./helpers/mesh.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { accountUsers, everyRight } from "./helpers/account-users.js";
import { collect } from "./helpers/collect.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";
import { present } from "./helpers/present.js";

// Every tenant principal of the configuration `toolmesh auth config` generates, run as an
// attacker against a real server with TLS: the server answers JetStream requests to whatever
// reply subject the requester names, so each answer a tenant can trigger is pointed at the
// mesh's streams, buckets, API and other tenants' subjects. Each attack asserts the damage did
// not happen and that the legitimate path still works. A control server shows the same deputy
// succeeding inside one account, so these assertions can fail.
//
// Run on both server versions: TOOLMESH_TEST_NATS_SERVER=/opt/nats-server-current/usr/sbin/nats-server.

const subjects = createSubjects();
// Services start slowly on a loaded machine; readiness is still their log line.
const START_MS = 120_000;
const CONNECTION_LIMIT = 24;
const SESSIONS = subjects.streams.sessions;

let pki: TestPki;
let server: NatsServerHandle;
const open: NatsConnection[] = [];
const { exportPasswords, credentials, connectAs, closeAll } = accountUsers(() => ({
  url: server.url,
  pki,
}));

/** The generated configuration, plus the users an attacker would be and the test's executor. */
export function attackConfig(tenants: string[]): string {
  return renderAccountConfig({
    tenants,
    // Low enough that a test can reach it.
    limits: { maxConnections: CONNECTION_LIMIT },
    extraUsers: [
      {
        account: tenantAccount("acme"),
        user: "frontend-acme-s1",
        permissions: rolePermissions("frontend", { tenant: "acme", session: "s1" }),
      },
      {
        account: tenantAccount("acme"),
        user: "frontend-acme-s2",
        permissions: rolePermissions("frontend", { tenant: "acme", session: "s2" }),
      },
      // A principal with every right inside its tenant's account: the account boundary alone
      // must hold it.
      everyRight(tenantAccount("acme"), "acme-root"),
      // Labelled: the test's observer of the mesh (every right in the mesh account).
      everyRight(MESH_ACCOUNT, "observer"),
    ],
  });
}

/** Lets the server route what was published (a round trip on each connection involved). */
async function settle(...ncs: NatsConnection[]): Promise<void> {
  for (const nc of ncs) await nc.flush();
  // JetStream handles requests on its own goroutines: a second round trip after a short pause
  // leaves time for the answers of the requests just flushed.
  await new Promise((resolve) => setTimeout(resolve, 300));
  for (const nc of ncs) await nc.flush();
}

interface MeshSnapshot {
  streams: Map<
    string,
    { created: string; first: number; last: number; messages: number; workQueue: boolean }
  >;
  consumers: string[];
  groupsRevision: number | undefined;
  toolRevision: number | undefined;
  policiesRevision: number | undefined;
}

async function snapshot(jsm: JetStreamManager, nc: NatsConnection): Promise<MeshSnapshot> {
  const streams: MeshSnapshot["streams"] = new Map();
  for await (const info of jsm.streams.list()) {
    streams.set(info.config.name, {
      created: info.created,
      first: info.state.first_seq,
      last: info.state.last_seq,
      messages: info.state.messages,
      workQueue: info.config.retention === "workqueue",
    });
  }
  const consumers: string[] = [];
  for (const stream of [
    subjects.streams.calls,
    subjects.callsStream("acme"),
    subjects.callsStream("globex"),
    subjects.streams.work,
    subjects.streams.events,
  ]) {
    for await (const c of jsm.consumers.list(stream)) consumers.push(`${stream}/${c.name}`);
  }
  const kvm = new Kvm(nc);
  const groups = await kvm.open(subjects.groupsBucket);
  const tools = await kvm.open(subjects.registryBucket);
  const policies = await kvm.open(subjects.policiesBucket);
  return {
    streams,
    consumers: consumers.sort(),
    groupsRevision: (await groups.get("globex"))?.revision,
    toolRevision: (await tools.get(subjects.registryKey("echo")))?.revision,
    policiesRevision: (await policies.status()).values,
  };
}

let mesh: NatsConnection;
let ledgers: string;
let jsm: JetStreamManager;

beforeAll(async () => {
  pki = await createTestPki();
  ledgers = await mkdtemp(join(tmpdir(), "toolmesh-attack-"));
  const config = attackConfig(["acme", "globex"]);
  exportPasswords(config);
  server = await startNatsServer({ config: `${config}\n${pki.serverTlsBlock()}\n` });
  const setup = await runCli(["setup", "--tenants", "acme,globex"], credentials("setup"));
  expect(setup.stderr).toBe("");
  const env = (user: string) => ({ ...credentials(user), TOOLMESH_ACK_WAIT_MS: "2000" });
  await Promise.all([
    startService("resolver", env("resolver"), START_MS),
    startService("executor", { ...env("executor"), TOOLMESH_TOOLS_DIR: "tools/builtin" }, START_MS),
    startService(
      "executor",
      {
        ...env("executor"),
        TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
        TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: ledgers }),
      },
      START_MS,
    ),
    startService("schema-expander", env("schema-expander"), START_MS),
  ]);
  mesh = await connectAs("observer");
  jsm = await jetstreamManager(mesh);
  // globex switched a group off: the deputy must not switch it back on.
  const groups = await new Kvm(mesh).open(subjects.groupsBucket);
  await groups.put("globex", JSON.stringify({ groups: { weather: false } }));
}, 3 * START_MS);

afterAll(async () => {
  for (const nc of open) await nc.close().catch(() => undefined);
  await closeAll();
  await killAllServices();
  await server?.stop();
  await stopAll();
  await pki?.remove();
  await rm(ledgers, { recursive: true, force: true });
});

/** A tenant frontend's client and a first, legitimate call (its stored result is a target). */
async function legitimateCall(
  user: string,
  tenant: string,
  session: string,
  text: string,
): Promise<{ nc: NatsConnection; client: ToolmeshClient; callId: string }> {
  const nc = await connectAs(user, {
    inboxPrefix: subjects.frontendInboxPrefix(tenant, user.endsWith(session) ? session : undefined),
  });
  const client = new ToolmeshClient(nc, { tenant, defaultTimeoutMs: 20_000 });
  const s = client.session(session);
  const handle = s.submit({ name: "echo", arguments: { text } });
  const result = await handle.result;
  expect(result.content).toBe(text);
  s.close();
  return { nc, client, callId: handle.callId };
}

describe("tenants in their own accounts, attacked", () => {
  it("a reply-subject deputy for every answer a tenant can trigger changes nothing in the mesh", async () => {
    const acme = await legitimateCall("frontend-acme", "acme", "s1", "acme-secret");
    const globex = await legitimateCall("frontend-globex", "globex", "g1", "globex-secret");
    // globex listens to its own sessions: nothing may arrive from acme's attacks.
    const globexSees = collect(globex.nc, "toolmesh.v1.sessions.globex.>");
    const before = await snapshot(jsm, mesh);
    expect(before.streams.get(subjects.streams.calls)).toBeDefined();
    expect(before.consumers).toContain(`${subjects.streams.calls}/resolver`);

    const stored = `toolmesh.v1.sessions.acme.s1.result.${acme.callId}`;
    const triggers: { subject: string; body: string }[] = [
      // the calls PubAck (an envelope the resolver refuses: nothing runs)
      { subject: "toolmesh.v1.calls.acme.s1", body: "{}" },
      // direct get 200 (its own stored result) and 404
      { subject: `$JS.API.DIRECT.GET.${SESSIONS}.${stored}`, body: "" },
      {
        subject: `$JS.API.DIRECT.GET.${SESSIONS}.toolmesh.v1.sessions.acme.s1.result.none`,
        body: "",
      },
      // the cancel and RPC answers of the services
      {
        subject: "toolmesh.v1.cancel.acme.s1",
        body: JSON.stringify({ tool_call_id: "x", session_id: "s1" }),
      },
      { subject: "toolmesh.v1.rpc.acme.catalog", body: "{}" },
      { subject: "toolmesh.v1.rpc.acme.groups", body: "{}" },
      { subject: "toolmesh.v1.rpc.acme.resolve", body: "{}" },
      // its audit trail's direct gets (its approver's reads): an event, and the last one
      { subject: `$JS.API.DIRECT.GET.${subjects.auditStream("acme")}`, body: '{"seq":1}' },
      {
        subject: `$JS.API.DIRECT.GET.${subjects.auditStream("acme")}.${subjects.audit("acme")}`,
        body: "",
      },
    ];
    const targets = [
      `$JS.API.STREAM.DELETE.${subjects.streams.calls}`,
      `$JS.API.STREAM.DELETE.${subjects.streams.work}`,
      `$JS.API.STREAM.PURGE.${SESSIONS}`,
      `$JS.API.STREAM.PURGE.KV_${subjects.callsBucket}`,
      `$JS.API.CONSUMER.DELETE.${subjects.streams.calls}.resolver`,
      `$JS.API.STREAM.MSG.DELETE.${SESSIONS}`,
      `$KV.${subjects.groupsBucket}.globex`,
      `$KV.${subjects.registryBucket}.echo`,
      `$KV.${subjects.policiesBucket}.operator`,
      `$KV.${subjects.policiesBucket}.tenant.acme`,
      "toolmesh.v1.work.echo",
      "toolmesh.v1.control.abort",
      `toolmesh.v1.sessions.globex.g1.result.${globex.callId}`,
      "toolmesh.v1.sessions.globex.g1.result.forged",
      "toolmesh.v1.calls.globex.g1",
      "toolmesh.v1.rpc.globex.groups",
      // each tenant's own calls stream, its consumer and the resolvers' intake (ADR 0048)
      `$JS.API.STREAM.DELETE.${subjects.callsStream("globex")}`,
      `$JS.API.STREAM.PURGE.${subjects.callsStream("acme")}`,
      `$JS.API.CONSUMER.DELETE.${subjects.callsStream("globex")}.resolver`,
      "toolmesh.v1.tenant-calls.globex.g1",
      subjects.intake,
      `$JS.API.STREAM.DELETE.${subjects.auditStream("globex")}`,
      `$JS.API.STREAM.UPDATE.${subjects.auditStream("acme")}`,
      // the audit trails, written directly or handed to the resolvers (ADR 0064)
      subjects.audit("acme"),
      subjects.auditWrite("acme"),
      subjects.auditWrite("globex"),
      // crossings of its own account: a second request whose body is the first answer
      `$JS.API.DIRECT.GET.${SESSIONS}.toolmesh.v1.sessions.acme.s1.result.x`,
    ];
    const attackers = await Promise.all(
      ["acme-root", "frontend-acme", "frontend-acme-s1"].map((user) =>
        connectAs(user, {
          inboxPrefix: subjects.frontendInboxPrefix("acme", user.endsWith("s1") ? "s1" : undefined),
        }),
      ),
    );
    for (const nc of attackers) {
      for (const trigger of triggers) {
        for (const reply of targets) nc.publish(trigger.subject, trigger.body, { reply });
      }
    }
    // The account-wide principal also asks the mesh's API itself, and its own account's.
    const root = attackers[0]!;
    for (const subject of [
      "$JS.API.INFO",
      `$JS.API.STREAM.DELETE.${subjects.streams.calls}`,
      `$JS.API.STREAM.PURGE.${SESSIONS}`,
      `$JS.API.STREAM.MSG.GET.${SESSIONS}`,
    ]) {
      for (const reply of targets) root.publish(subject, JSON.stringify({ seq: 1 }), { reply });
    }
    await settle(...attackers, mesh, globex.nc);

    const after = await snapshot(jsm, mesh);
    expect([...after.streams.keys()].sort()).toEqual([...before.streams.keys()].sort());
    for (const [name, state] of before.streams) {
      // Not deleted and made again; and, where consumers do not remove messages, nothing purged
      // (first sequence kept) and nothing removed.
      expect(after.streams.get(name)?.created, name).toBe(state.created);
      if (state.workQueue) continue;
      // The quota usage bucket's keys are rewritten while calls end (the tenants' stored bytes,
      // ADR 0050), so its first sequence moves on; a purge would still lose keys, checked below.
      if (name !== `KV_${subjects.quotaUsageBucket}`)
        expect(after.streams.get(name)?.first, name).toBe(state.first);
      expect(after.streams.get(name)!.messages, name).toBeGreaterThanOrEqual(state.messages);
    }
    expect(after.consumers).toEqual(before.consumers);
    expect(after.groupsRevision).toBe(before.groupsRevision);
    expect(after.toolRevision).toBe(before.toolRevision);
    expect(after.policiesRevision).toBe(before.policiesRevision);
    // No junk work: the deputy's PubAcks never reached the work stream, nor another tenant's
    // calls stream.
    expect(after.streams.get(subjects.streams.work)?.messages).toBe(0);
    const globexCalls = subjects.callsStream("globex");
    expect(after.streams.get(globexCalls)?.last).toBe(before.streams.get(globexCalls)?.last);
    expect(globexSees.map((m) => m.subject)).toEqual([]);

    // The legitimate path still works for both tenants.
    const again = globex.client.session("g1");
    expect(
      (await again.submit({ name: "echo", arguments: { text: "still" } }).result).content,
    ).toBe("still");
    again.close();
    const acmeAgain = acme.client.session("s1");
    expect(
      (await acmeAgain.submit({ name: "echo", arguments: { text: "ok" } }).result).content,
    ).toBe("ok");
    acmeAgain.close();
  });

  it("a tenant's principals neither read nor write policy sets; the operator does", async () => {
    const dir = await mkdtemp(join(tmpdir(), "toolmesh-attack-policy-"));
    const file = join(dir, "operator.cedar");
    await writeFile(file, `@id("open") permit (principal, action, resource);\n`);
    const set = await runCli(["policy", "set", file, "--json"], credentials("operator"));
    expect(set.stderr).toBe("");
    expect(set.code).toBe(0);
    const policies = await new Kvm(mesh).open(subjects.policiesBucket);
    const stored = await policies.get("operator");
    expect(stored?.string()).toContain('@id("open")');
    const before = (await policies.status()).values;

    const attackers = await Promise.all(
      ["acme-root", "frontend-acme"].map((user) =>
        connectAs(user, { inboxPrefix: subjects.frontendInboxPrefix("acme") }),
      ),
    );
    const forbidAll = `@id("x") forbid (principal, action, resource);`;
    // A request that reaches nothing times out or is refused; one answered inside the
    // tenant's own account (which has no JetStream) is an error, never the bucket's content.
    const answerTo = (nc: NatsConnection, subject: string, body: string) =>
      nc.request(subject, body, { timeout: 1_000 }).then(
        (m) => m.string(),
        () => "",
      );
    for (const nc of attackers) {
      // Read: the bucket's API and its direct gets are not reachable from a tenant account.
      const read = await answerTo(
        nc,
        `$JS.API.DIRECT.GET.KV_${subjects.policiesBucket}.$KV.${subjects.policiesBucket}.operator`,
        "",
      );
      expect(read).not.toContain("permit");
      const info = await answerTo(nc, `$JS.API.STREAM.INFO.KV_${subjects.policiesBucket}`, "");
      expect(info).not.toContain(subjects.policiesBucket);
      // Write: straight onto the bucket's subjects, with and without asking for an ack.
      for (const key of ["operator", "tenant.acme", "tenant.globex"]) {
        nc.publish(`$KV.${subjects.policiesBucket}.${key}`, forbidAll);
        const ack = await answerTo(nc, `$KV.${subjects.policiesBucket}.${key}`, forbidAll);
        expect(ack).not.toMatch(/"seq"/);
      }
    }
    // The tenant's own CLI, with its frontend's credentials, is refused too.
    const asTenant = await runCli(
      ["policy", "set", file, "--tenant", "acme"],
      credentials("frontend-acme"),
    );
    expect(asTenant.code).not.toBe(0);
    await settle(...attackers, mesh);
    expect((await policies.status()).values).toBe(before);
    expect((await policies.get("operator"))?.revision).toBe(stored?.revision);
    expect(await policies.get("tenant.acme")).toBeNull();
    for (const nc of attackers) await nc.close();
    // Removed again, so the other cases run with every tool open.
    expect((await runCli(["policy", "rm", "--operator"], credentials("operator"))).code).toBe(0);
    await rm(dir, { recursive: true, force: true });
  });

  it("a tenant stores calls in its own calls stream only, and never reads the resolvers' intake", async () => {
    const acme = await legitimateCall("frontend-acme", "acme", "s3", "mine");
    const globex = await legitimateCall("frontend-globex", "globex", "g3", "theirs");
    const stored = async (tenant: string) =>
      (await jsm.streams.info(subjects.callsStream(tenant))).state.last_seq;
    const before = { acme: await stored("acme"), globex: await stored("globex") };
    const sharedBefore = (await jsm.streams.info(subjects.streams.calls)).state.last_seq;
    const root = await connectAs("acme-root", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    const intake = collect(root, subjects.intake);
    // What reaches the mesh on globex's stored subjects: only globex's own call, below.
    const reachesGlobex = collect(mesh, "toolmesh.v1.tenant-calls.globex.>");
    await mesh.flush();
    const call = JSON.stringify({
      tool_call: { id: "forged", type: "function", function: { name: "echo", arguments: "{}" } },
      session_id: "g3",
    });
    // Its account-wide principal publishes on the stored subjects of both tenants, on another
    // tenant's wire subject and on the intake, plain and as JetStream requests.
    for (const subject of [
      "toolmesh.v1.tenant-calls.globex.g3",
      "toolmesh.v1.tenant-calls.acme.s3",
      "toolmesh.v1.calls.globex.g3",
      subjects.intake,
    ]) {
      root.publish(subject, call);
      await expect(root.request(subject, call, { timeout: 1_000 })).rejects.toThrow(
        /no responders|timeout/i,
      );
    }
    // Its frontend may not even name the stored subject of its own calls.
    const frontend = await connectAs("frontend-acme", {
      inboxPrefix: subjects.frontendInboxPrefix("acme"),
    });
    await expect(
      frontend.request("toolmesh.v1.tenant-calls.acme.s3", call, { timeout: 1_000 }),
    ).rejects.toThrow(/permissions violation/i);
    // Meanwhile both tenants' own calls go on.
    const again = [
      await acme.client.session("s3").submit({ name: "echo", arguments: { text: "a" } }).result,
      await globex.client.session("g3").submit({ name: "echo", arguments: { text: "g" } }).result,
    ];
    await settle(root, frontend, mesh);
    expect(again.map((m) => m.content)).toEqual(["a", "g"]);
    // Each tenant's stream took exactly its own new call; the mesh's took none of theirs.
    expect(await stored("acme")).toBe(before.acme + 1);
    expect(await stored("globex")).toBe(before.globex + 1);
    expect((await jsm.streams.info(subjects.streams.calls)).state.last_seq).toBe(sharedBefore);
    // Its own account echoes its own publishes; no delivery of the mesh's (acked by $JS.ACK) arrives.
    expect(intake.filter((m) => m.reply?.startsWith("$JS.ACK") === true)).toEqual([]);
    expect(reachesGlobex.map((m) => m.subject)).toEqual(["toolmesh.v1.tenant-calls.globex.g3"]);
    await frontend.close();
    await root.close();
  });

  it("a direct get whose body names another tenant's message answers nothing of it", async () => {
    const globex = await legitimateCall("frontend-globex", "globex", "g2", "globex-private");
    const victim = `toolmesh.v1.sessions.globex.g2.result.${globex.callId}`;
    const { seq } = present(
      await jsm.streams.getMessage(SESSIONS, { last_by_subj: victim }),
      "globex's result",
    );
    const acme = await legitimateCall("frontend-acme", "acme", "s1", "acme-own");
    const own = `$JS.API.DIRECT.GET.${SESSIONS}.toolmesh.v1.sessions.acme.s1.result.${acme.callId}`;
    const bodies = [
      { seq },
      { last_by_subj: victim },
      { next_by_subj: victim, seq: 1 },
      { next_by_subj: "toolmesh.v1.sessions.>", seq: 1 },
      { multi_last: [victim], batch: 10 },
      { batch: 10, next_by_subj: "toolmesh.v1.sessions.globex.>" },
    ];
    for (const body of bodies) {
      const answer = await acme.nc.request(own, JSON.stringify(body), { timeout: 2000 }).then(
        (m) => m,
        () => undefined,
      );
      const text = answer === undefined ? "" : answer.string();
      const subject = answer?.headers?.get("Nats-Subject") ?? "";
      expect(text, JSON.stringify(body)).not.toContain("globex-private");
      expect(subject, JSON.stringify(body)).not.toContain("globex");
    }
    // The bodiless form still answers its own result.
    const mine = await acme.nc.request(own, "", { timeout: 2000 });
    expect(mine.string()).toContain("acme-own");
  });

  it("a tenant's frontend names its own users only: another tenant's are refused", async () => {
    const globex = await legitimateCall("frontend-globex", "globex", "g4", "own");
    const session = globex.client.session("g4");
    const own = await session.submit(
      { name: "echo", arguments: { text: "as carol" } },
      { identity: { issuer: "https://idp.globex.test/", subject: "carol", tenant: "globex" } },
    ).result;
    expect(own.content).toBe("as carol");
    // Claiming acme's user from globex's account: the subject's tenant is globex's, whatever
    // the body says, and the resolver refuses the claim before anything runs.
    const claimed = await session.submit(
      { name: "echo", arguments: { text: "as acme's alice" } },
      { identity: { issuer: "https://idp.acme.test/", subject: "alice", tenant: "acme" } },
    ).result;
    expect(claimed.error?.code).toBe(ErrorCode.PermissionDenied);
    expect(claimed.error?.details).toEqual({ identity_tenant: "acme" });
    session.close();
  });

  it("no principal of a tenant sees another tenant's sessions or the mesh's inboxes", async () => {
    const root = await connectAs("acme-root");
    const everything = collect(root, ">");
    const subscribed = collect(root, "toolmesh.v1.sessions.globex.>");
    await root.flush();
    await legitimateCall("frontend-globex", "globex", "g3", "globex-watched");
    await settle(root);
    expect(subscribed).toEqual([]);
    for (const msg of everything) {
      expect(msg.subject).not.toContain("globex");
      expect(msg.string()).not.toContain("globex-watched");
    }
  });

  it("a session-confined frontend neither reads nor forges another session of its tenant", async () => {
    const s2 = await legitimateCall("frontend-acme-s2", "acme", "s2", "s2-private");
    const s1 = await legitimateCall("frontend-acme-s1", "acme", "s1", "s1-own");
    // s2 awaits a call; s1 makes the server place its own stored result on s2's subjects.
    const waiting = s2.client.session("s2");
    const pending = waiting.submit({ name: "sleepy", arguments: { ms: 1500 } });
    const seenByS1 = collect(s1.nc, "toolmesh.v1.sessions.acme.s1.>");
    const deliveredToS2 = collect(s2.nc, "toolmesh.v1.sessions.acme.s2.>");
    await s2.nc.flush();
    const own = `$JS.API.DIRECT.GET.${SESSIONS}.toolmesh.v1.sessions.acme.s1.result.${s1.callId}`;
    for (const reply of [
      `toolmesh.v1.sessions.acme.s2.result.${pending.callId}`,
      `toolmesh.v1.sessions.acme.s2.progress.${pending.callId}`,
    ]) {
      s1.nc.publish(own, "", { reply });
    }
    await settle(s1.nc);
    // The server does deliver the forgery inside the tenant's account (a limit of session
    // confinement, docs/security.md); the client drops what names another session.
    expect(deliveredToS2.some((m) => m.string().includes("s1-own"))).toBe(true);
    const result = await pending.result;
    expect(result.error).toBeUndefined();
    expect(JSON.stringify(result)).not.toContain("s1-own");
    waiting.close();
    // Reading s2: refused subscriptions and direct gets deliver nothing.
    collect(s1.nc, "toolmesh.v1.sessions.acme.s2.>");
    const read = await s1.nc
      .request(
        `$JS.API.DIRECT.GET.${SESSIONS}.toolmesh.v1.sessions.acme.s2.result.${s2.callId}`,
        "",
        {
          timeout: 1000,
        },
      )
      .then(
        (m) => m.string(),
        (e: unknown) => String(e),
      );
    expect(read).not.toContain("s2-private");
    await settle(s1.nc);
    for (const msg of seenByS1) expect(msg.string()).not.toContain("s2-private");
  });
});

describe("the mesh's own services and the audit trails", () => {
  it("only the resolvers write a trail; only executors and bridges hand events to them", async () => {
    const trail = subjects.auditStream("acme");
    const before = (await jsm.streams.info(trail)).state.last_seq;
    const forged = JSON.stringify({ v: 1, type: "call.ended", tenant: "acme", by: "forger" });
    const handed = JSON.stringify({ events: [] });
    // A resolver's user answers what is handed on (the mesh here runs without audit).
    const resolver = await connectAs("resolver", { inboxPrefix: subjects.inboxPrefix("resolver") });
    open.push(resolver);
    resolver.subscribe(subjects.allAuditWrites, {
      queue: "toolmesh-audit-write",
      callback: (_err, msg) => {
        msg.respond(JSON.stringify({ written: 0 }));
      },
    });
    await resolver.flush();
    for (const user of ["gateway", "schema-expander", "executor", "mcp-bridge"]) {
      const nc = await connectAs(user, { inboxPrefix: subjects.inboxPrefix(user) });
      open.push(nc);
      // Straight into the stream: refused to every service but the resolvers.
      await expect(nc.request(subjects.audit("acme"), forged, { timeout: 2_000 })).rejects.toThrow(
        /permissions violation/i,
      );
      const handOn = nc.request(subjects.auditWrite("acme"), handed, { timeout: 2_000 });
      if (user === "executor" || user === "mcp-bridge") {
        // Allowed both ways: the resolver's answer reaches the service's own inbox.
        expect((await handOn).json()).toEqual({ written: 0 });
      } else {
        await expect(handOn).rejects.toThrow(/permissions violation/i);
      }
    }
    expect((await jsm.streams.info(trail)).state.last_seq).toBe(before);
  });
});

describe("the final messages whose ends the resolvers record", () => {
  it("are taken by the resolvers alone: no other service may take, and so settle, one", async () => {
    const resolver = await connectAs("resolver", { inboxPrefix: subjects.inboxPrefix("resolver") });
    open.push(resolver);
    // The resolvers make the consumer and take from it (ADR 0068).
    await ensureConsumer(await jetstreamManager(resolver), auditEndsConsumerSpec(subjects));
    const stream = subjects.streams.sessions;
    const consumer = subjects.auditEndsConsumer;
    const pull = JSON.stringify({ batch: 1, no_wait: true });
    const next = `$JS.API.CONSUMER.MSG.NEXT.${stream}.${consumer}`;
    await resolver.request(next, pull, { timeout: 2_000 });
    for (const user of ["gateway", "schema-expander", "executor", "mcp-bridge"]) {
      const nc = await connectAs(user, { inboxPrefix: subjects.inboxPrefix(user) });
      open.push(nc);
      for (const subject of [
        next,
        `$JS.API.CONSUMER.DELETE.${stream}.${consumer}`,
        `$JS.API.CONSUMER.CREATE.${stream}.${consumer}.${subjects.allResults}`,
      ])
        await expect(
          nc.request(subject, pull, { timeout: 2_000 }),
          `${user} ${subject}`,
        ).rejects.toThrow(/permissions violation/i);
      // A final message is recorded as its call's end, named by its Toolmesh-Ended header: only
      // the services that end calls (the tool hosts, and the resolvers) may store one.
      if (user === "gateway" || user === "schema-expander")
        await expect(
          nc.request(subjects.result({ tenant: "acme", session: "s1" }, "forged-end"), "{}", {
            timeout: 2_000,
          }),
          `${user} publishes a final message`,
        ).rejects.toThrow(/permissions violation/i);
    }
  });
});

describe("exhaustion across tenants", () => {
  it("a tenant that opens every connection it may leaves other tenants able to connect and call", async () => {
    const extra: NatsConnection[] = [];
    let refused: Error | undefined;
    for (let i = 0; i <= CONNECTION_LIMIT && refused === undefined; i++) {
      await connectAs("frontend-acme", { connectTimeoutMs: 2_000 }).then(
        (nc) => extra.push(nc),
        (err: unknown) => {
          refused = err as Error;
        },
      );
    }
    // The account's limit, not the server's, stopped it.
    expect(refused).toBeDefined();
    expect(extra.length).toBeLessThan(CONNECTION_LIMIT);
    const globex = await legitimateCall("frontend-globex", "globex", "g4", "globex-connects");
    expect(globex.callId).not.toBe("");
    for (const nc of extra) await nc.close();
  });
});

describe("the control: inside one account the deputy works", () => {
  let control: NatsServerHandle;
  afterAll(async () => control?.stop());

  it("a user allowed only its direct gets deletes a stream with a reply subject", async () => {
    control = await startNatsServer({
      config: [
        "accounts {",
        "  ONE: {",
        "    jetstream: enabled",
        "    users: [",
        '      { user: "admin", password: "admin" }',
        '      { user: "deputy", password: "deputy", permissions: { publish: { allow: ["foo.>", "$JS.API.DIRECT.GET.S.foo.>"] }, subscribe: { allow: ["_INBOX.>"] } } }',
        "    ]",
        "  }",
        "}",
      ].join("\n"),
    });
    const admin = await connectNats({ servers: control.url, user: "admin", password: "admin" });
    const deputy = await connectNats({ servers: control.url, user: "deputy", password: "deputy" });
    open.push(admin, deputy);
    const adminJsm = await jetstreamManager(admin);
    await adminJsm.streams.add({ name: "S", subjects: ["foo.>"], allow_direct: true });
    await adminJsm.streams.add({ name: "W", subjects: ["w.>"] });
    deputy.publish("$JS.API.DIRECT.GET.S.foo.none", "", { reply: "$JS.API.STREAM.DELETE.W" });
    await settle(deputy, admin);
    const names: string[] = [];
    for await (const name of adminJsm.streams.names()) names.push(name);
    expect(names).not.toContain("W");
    expect(names).toContain("S");
  });
});
