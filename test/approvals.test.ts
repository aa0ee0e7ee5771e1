import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import type { SessionEvent } from "@toolmesh/client";
import { ToolmeshClient } from "@toolmesh/client";
import type { ApprovalEntry, ApprovalRequiredEvent, ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { CallStore } from "@toolmesh/call-store";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { eventually, until } from "./helpers/eventually.js";

// Calls that wait for a person (ADR 0059), through a real mesh: a permit annotated
// `@approval("operator")` holds calls of `sleepy` tagged "danger"; `toolmesh approvals` lists
// and decides them. The `sleepy` tool writes one ledger line per execution, so "ran once" and
// "never ran" are counted, not assumed.

const POLICY = `@id("all")
permit (principal, action, resource);

@id("danger-needs-operator")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"sleepy")
when { context.args has tag && context.args.tag == "danger" };

@id("brief-needs-operator")
@approval("operator")
@approval_ttl("2s")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"sleepy")
when { context.args has tag && context.args.tag == "brief" };

@id("caller-confirms")
@approval("caller")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"sleepy")
when { context.args has tag && context.args.tag == "confirm" };
`;

let server: NatsServerHandle;
let nc: NatsConnection;
let env: Record<string, string>;
let ledgerDir: string;
let resolver: ServiceProcess;
let executor: ServiceProcess;

beforeAll(async () => {
  server = await startNatsServer();
  ledgerDir = await mkdtemp(join(tmpdir(), "toolmesh-approvals-"));
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-rel"),
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir }),
    TOOLMESH_ACK_WAIT_MS: "1000",
  };
  resolver = await startService("resolver", env);
  executor = await startService("executor", env);
  await toolAvailable(resolver, "sleepy");
  nc = await connect({ servers: server.url });
  const store = new PolicyStore(await openPolicyBucket(nc, { subjects: createSubjects() }));
  const { revision } = await store.set(POLICY);
  await resolver.waitForLog(
    (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
  );
}, 90_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
  if (ledgerDir !== undefined) await rm(ledgerDir, { recursive: true, force: true });
});

/** How often the call `callId` ran: ledger lines of its key. */
async function runs(callId: string): Promise<number> {
  let lines = 0;
  for (const file of await readdir(ledgerDir)) {
    if (!decodeURIComponent(file).endsWith(`/${callId}`)) continue;
    lines += (await readFile(join(ledgerDir, file), "utf8")).split("\n").filter(Boolean).length;
  }
  return lines;
}

async function approvals(...args: string[]): Promise<{ code: number; stdout: string }> {
  const out = await runCli(["--tenant", "acme", "approvals", ...args], env);
  return { code: out.code ?? -1, stdout: out.stdout };
}

async function waiting(): Promise<ApprovalEntry[]> {
  const out = await approvals("list", "--json");
  expect(out.code).toBe(0);
  return JSON.parse(out.stdout) as ApprovalEntry[];
}

/** Waits until `callId` is listed as waiting; returns its entry. */
function listed(callId: string): Promise<ApprovalEntry> {
  return eventually(`call ${callId} listed as waiting`, async () =>
    (await waiting()).find((e) => e.call_id === callId),
  );
}

let sessions = 0;
function submit(
  callId: string,
  args: Record<string, unknown>,
  on?: (e: SessionEvent) => void,
): { result: Promise<ToolMessage>; close: () => void; client: ToolmeshClient; sessionId: string } {
  const client = new ToolmeshClient(nc, { tenant: "acme" });
  const sessionId = `ap-${++sessions}`;
  const session = client.session(sessionId);
  if (on !== undefined) session.onEvent(on);
  const { result } = session.submit({ id: callId, name: "sleepy", arguments: args });
  return { result, close: () => session.close(), client, sessionId };
}

describe("calls that wait for approval", () => {
  it("waits, tells its session, lists once when submitted twice, and runs once when approved", async () => {
    const events: ApprovalRequiredEvent[] = [];
    const call = submit("ok-1", { ms: 10, tag: "danger" }, (e) => {
      if (e.type === "approval") events.push(e.event);
    });
    const entry = await listed("ok-1");
    expect(entry).toMatchObject({
      tenant: "acme",
      tool: "sleepy",
      args: { ms: 10, tag: "danger" },
      mode: "operator",
      policies: ["operator:danger-needs-operator"],
    });
    expect(entry.expires_at - entry.requested_at).toBe(24 * 3_600_000);
    await until("the session told", () => events.length > 0);
    expect(events[0]).toMatchObject({ tool_call_id: "ok-1", mode: "operator" });
    expect(await runs("ok-1")).toBe(0);
    // `policy check` says the same of such a call before it is made.
    const check = await runCli(
      [
        "--tenant",
        "acme",
        "policy",
        "check",
        "--tool",
        "sleepy",
        "--args",
        '{"ms":10,"tag":"danger"}',
      ],
      env,
    );
    expect(check).toMatchObject({ code: 0, stderr: "" });
    expect(check.stdout).toMatch(
      /^call: approval by the operator \(operator:all, operator:danger-needs-operator; operator@\d+\)$/m,
    );
    // A call without the tag needs nobody.
    const plain = submit("plain-1", { ms: 5 });
    expect((await plain.result).error).toBeUndefined();
    plain.close();

    expect((await approvals("approve", "ok-1", "--reason", "checked")).code).toBe(0);
    const result = await call.result;
    expect(result.error).toBeUndefined();
    expect(await runs("ok-1")).toBe(1);
    call.close();
    // The decision is kept with the call's record.
    const store = await CallStore.bind(nc, createSubjects());
    const record = await store.get({
      idempotency_key: `${call.sessionId}/ok-1`,
      address: { tenant: "acme", session: call.sessionId },
    });
    expect(record?.record.state).toBe("done");
    expect([...(record?.record.decision?.policies ?? [])].sort()).toEqual([
      "operator:all",
      "operator:danger-needs-operator",
    ]);
    expect(record?.record.decision).toMatchObject({
      effect: "approval",
      approval: { mode: "operator", effect: "approve", by: "approver:acme", reason: "checked" },
    });
    // Replaying the approval is refused and runs nothing again.
    const replay = await approvals("approve", "ok-1");
    expect(replay.code).toBe(1);
    expect(await runs("ok-1")).toBe(1);
  });

  it("asks again when a call comes back with one argument changed", async () => {
    const first = submit("arg-1", { ms: 10, tag: "danger" });
    await listed("arg-1");
    expect((await approvals("approve", "arg-1")).code).toBe(0);
    expect((await first.result).error).toBeUndefined();
    first.close();
    const changed = submit("arg-2", { ms: 11, tag: "danger" });
    const entry = await listed("arg-2");
    expect(entry.args).toEqual({ ms: 11, tag: "danger" });
    expect(await runs("arg-2")).toBe(0);
    expect((await approvals("deny", "arg-2")).code).toBe(0);
    expect((await changed.result).error?.code).toBe("approval_denied");
    changed.close();
  });

  it("ends a denied call with approval_denied; the tool never ran", async () => {
    const call = submit("deny-1", { ms: 10, tag: "danger" });
    await listed("deny-1");
    const out = await approvals("deny", "deny-1", "--reason", "not on a Friday");
    expect(out.code).toBe(0);
    const result = await call.result;
    expect(result.error?.code).toBe("approval_denied");
    expect(result.error?.details).toMatchObject({
      decided_by: "approver:acme",
      reason: "not on a Friday",
    });
    call.close();
    expect(await runs("deny-1")).toBe(0);
    expect((await waiting()).some((e) => e.call_id === "deny-1")).toBe(false);
    // Approving it afterwards is refused.
    expect((await approvals("approve", "deny-1")).code).toBe(1);
    expect(await runs("deny-1")).toBe(0);
  });

  it("ends a call nobody decided in time with approval_expired; the tool never ran", async () => {
    // An entry that is not an approval (not even JSON) is passed over: the sweep goes on.
    const bucket = await new Kvm(nc).open(createSubjects().callApprovalsBucket);
    await bucket.put("default.s.not-json", "{not json");
    const call = submit("exp-1", { ms: 10, tag: "brief" });
    const result = await call.result;
    expect(result.error?.code).toBe("approval_expired");
    expect(
      resolver.lines.some(
        (l) => l.key === "default.s.not-json" && /another shape; ignored/.test(String(l.msg)),
      ),
    ).toBe(true);
    await bucket.delete("default.s.not-json");
    call.close();
    expect(await runs("exp-1")).toBe(0);
    expect((await approvals("approve", "exp-1")).code).toBe(1);
    expect(await runs("exp-1")).toBe(0);
  });

  it("lets the caller confirm or decline a call that waits for it, and nobody else", async () => {
    const events: ApprovalRequiredEvent[] = [];
    const client = new ToolmeshClient(nc, { tenant: "acme" });
    const session = client.session(`ap-confirm-${++sessions}`);
    session.onEvent((e) => {
      if (e.type === "approval") events.push(e.event);
    });
    const yes = session.submit({
      id: "cf-1",
      name: "sleepy",
      arguments: { ms: 5, tag: "confirm" },
    });
    const no = session.submit({ id: "cf-2", name: "sleepy", arguments: { ms: 5, tag: "confirm" } });
    await until("both announced", () => events.length >= 2);
    expect(events.every((e) => e.mode === "caller")).toBe(true);
    // A caller's call is not the operator's to list, nor another session's to confirm.
    expect((await waiting()).some((e) => e.call_id === "cf-1")).toBe(false);
    const other = client.session(`ap-other-${++sessions}`);
    expect((await other.confirm("cf-1", true)).ok).toBe(false);
    other.close();
    expect((await session.confirm("cf-1", true)).ok).toBe(true);
    expect((await session.confirm("cf-2", false, { reason: "changed my mind" })).ok).toBe(true);
    expect((await yes.result).error).toBeUndefined();
    expect((await no.result).error?.code).toBe("approval_denied");
    // A second answer is refused.
    expect((await session.confirm("cf-1", true)).ok).toBe(false);
    session.close();
    expect(await runs("cf-1")).toBe(1);
    expect(await runs("cf-2")).toBe(0);
  });

  it("keeps a waiting call through kills of the resolver, the executor and NATS, then runs it once", async () => {
    const call = submit("kill-1", { ms: 10, tag: "danger" });
    const sessionId = call.sessionId;
    await listed("kill-1");
    call.close();
    await resolver.kill();
    await executor.kill();
    await server.kill();
    await server.restart();
    resolver = await startService("resolver", env);
    executor = await startService("executor", env);
    await toolAvailable(resolver, "sleepy");
    expect(await runs("kill-1")).toBe(0);
    await listed("kill-1");
    expect((await approvals("approve", "kill-1")).code).toBe(0);
    await until("the approved call ran", async () => (await runs("kill-1")) === 1, {
      timeoutMs: 30_000,
    });
    // Submitted again under its key, it is answered from its record, not run again.
    const again = new ToolmeshClient(nc, { tenant: "acme" }).session(sessionId);
    const result = await again.submit({
      id: "kill-1",
      name: "sleepy",
      arguments: { ms: 10, tag: "danger" },
    }).result;
    expect(result.error).toBeUndefined();
    again.close();
    expect(await runs("kill-1")).toBe(1);
  });
});
