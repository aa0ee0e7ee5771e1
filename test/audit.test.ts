import { mkdtemp, readFile, readdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { headers } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { Header, createSubjects } from "@toolmesh/protocol";
import type { AuditRecord } from "@toolmesh/audit";
import { canonicalDigest, readTrail } from "@toolmesh/audit";
import { CallStore } from "@toolmesh/call-store";
import { PolicyStore, openPolicyBucket } from "@toolmesh/policy";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";
import { writeStdioTestServer } from "./helpers/mcp-test-server.js";
import { eventually, until } from "./helpers/eventually.js";

// The audit trail through a real mesh: three resolvers and an executor with
// TOOLMESH_AUDIT=required, the tenant's audit stream made by `toolmesh setup --tenants`.

const subjects = createSubjects();
const STREAM = subjects.auditStream("default");
let server: NatsServerHandle;
let nc: NatsConnection;
let client: ToolmeshClient;
let env: Record<string, string>;
const resolvers: ServiceProcess[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  // Uncompressed, so the tamper test can find a stored event's bytes on disk.
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-a"),
    TOOLMESH_AUDIT: "required",
    TOOLMESH_STREAM_COMPRESSION: "none",
    // The tenant records its arguments in full but for one redacted value.
    TOOLMESH_AUDIT_ARGUMENTS: JSON.stringify({ default: { redact: ["/options/lang"] } }),
  };
  expect((await runCli(["setup", "--tenants", "default"], env)).code).toBe(0);
  for (let i = 0; i < 3; i++) resolvers.push(await startService("resolver", env));
  await startService("executor", env);
  // An MCP server's tools, through the bridge.
  const mcpDir = await mkdtemp(join(tmpdir(), "toolmesh-audit-mcp-"));
  await writeStdioTestServer(mcpDir, "fx");
  await startService("mcp-bridge", { ...env, TOOLMESH_MCP_DIR: mcpDir }, 60_000);
  await Promise.all(
    resolvers.map((r) => toolAvailable(r, "inspect", "misbehave", "whoami", "fx.echo")),
  );
  nc = await connect({ servers: server.url });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 15_000 });
}, 90_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

async function trail(): Promise<AuditRecord[]> {
  const events: AuditRecord[] = [];
  for await (const { record } of readTrail(nc, subjects, "default"))
    events.push(record as AuditRecord);
  return events;
}

/** The types of a call's events, in chain order, once its last one (`last`) is written. */
async function typesOf(callId: string, last: string): Promise<string[]> {
  let types: string[] = [];
  await until(`the audit events of ${callId} up to ${last}`, async () => {
    types = (await trail()).filter((e) => e.call_id === callId).map((e) => e.type);
    return types.includes(last);
  });
  return types;
}

/**
 * The events of a call that ran once, briefly, and ended: its attempt is recorded by the call's
 * end (by the executor, with its attempts and duration; ADR 0067).
 */
const RAN_ONCE = ["call.admitted", "call.ended"];

/** The events of a call whose attempt ran past the time an attempt's start is recorded. */
const RAN_LONG = ["call.admitted", "attempt.started", "attempt.ended", "call.ended"];

/** A call's event of `type`. */
async function eventOf(callId: string, type: string): Promise<AuditRecord | undefined> {
  return (await trail()).find((e) => e.call_id === callId && e.type === type);
}

describe("each outcome's events, in order", () => {
  it("ok: admitted, the attempt, ended with a digest of the result", async () => {
    const handle = client.session("s-ok").submit({ name: "inspect", arguments: { query: "q" } });
    expect((await handle.result).error).toBeUndefined();
    expect(await typesOf(handle.callId, "call.ended")).toEqual(RAN_ONCE);
    const ended = await eventOf(handle.callId, "call.ended");
    expect(ended?.data).toMatchObject({ outcome: "ok", attempts: 1 });
    expect(ended?.data.duration_ms).toEqual(expect.any(Number));
    expect(ended?.by).toMatch(/^executor@/);
    expect(String(ended?.data.result_digest)).toMatch(/^sha256:[0-9a-f]{64}$/);
  });

  it("ok after a while: the attempt's start once it has run a second, then its end", async () => {
    const handle = client
      .session("s-long")
      .submit({ name: "whoami", arguments: { delay_ms: 1_500 } });
    expect((await handle.result).error).toBeUndefined();
    expect(await typesOf(handle.callId, "call.ended")).toEqual(RAN_LONG);
    const started = await eventOf(handle.callId, "attempt.started");
    const ended = await eventOf(handle.callId, "attempt.ended");
    expect(started?.data).toEqual({ attempt: 1 });
    expect(ended?.data).toMatchObject({ attempt: 1, outcome: "ok" });
    expect(ended?.data.duration_ms).toBeGreaterThanOrEqual(1_500);
    // `at` is when the attempt started, though it was written a second later.
    expect((ended?.at ?? 0) - (started?.at ?? 0)).toBeGreaterThanOrEqual(1_500);
  });

  it("retried: each failed attempt's start and end, the last one by the call's end", async () => {
    const handle = client
      .session("s-flaky")
      .submit({ name: "misbehave", arguments: { mode: "flaky" } });
    expect((await handle.result).error).toBeUndefined();
    expect(await typesOf(handle.callId, "call.ended")).toEqual([
      "call.admitted",
      "attempt.started",
      "attempt.ended",
      "call.ended",
    ]);
    expect((await eventOf(handle.callId, "attempt.ended"))?.data).toMatchObject({
      attempt: 1,
      outcome: "tool_error",
    });
    expect((await eventOf(handle.callId, "call.ended"))?.data).toMatchObject({
      outcome: "ok",
      attempts: 2,
    });
  });

  it("a bridged MCP tool: admitted, the attempt, ended, written by the bridge", async () => {
    const handle = client.session("s-mcp").submit({ name: "fx.echo", arguments: { text: "hi" } });
    expect((await handle.result).error).toBeUndefined();
    expect(await typesOf(handle.callId, "call.ended")).toEqual(RAN_ONCE);
    expect((await eventOf(handle.callId, "call.ended"))?.by).toMatch(/^mcp-bridge@/);
  });

  it("a typed error: the attempt's code and the call's", async () => {
    const handle = client
      .session("s-err")
      .submit({ name: "misbehave", arguments: { mode: "terminal" } });
    expect((await handle.result).error?.code).toBe("tool_error");
    expect(await typesOf(handle.callId, "call.ended")).toEqual(RAN_ONCE);
    expect((await eventOf(handle.callId, "call.ended"))?.data).toMatchObject({
      outcome: "tool_error",
      attempts: 1,
    });
  });

  it("refused: the refusal's code, then the end; never admitted", async () => {
    const handle = client.session("s-ref").submit({ name: "no_such_tool", arguments: {} });
    expect((await handle.result).error?.code).toBe("unknown_tool");
    expect(await typesOf(handle.callId, "call.ended")).toEqual(["call.refused", "call.ended"]);
    const refused = (await trail()).find((e) => e.call_id === handle.callId);
    expect(refused?.data).toMatchObject({ code: "unknown_tool" });
  });

  it("cancelled: admitted, attempt started, cancelled", async () => {
    const handle = client
      .session("s-cancel")
      .submit({ name: "whoami", arguments: { delay_ms: 5_000 } });
    await typesOf(handle.callId, "attempt.started");
    await handle.cancel();
    expect((await handle.result).error?.code).toBe("cancelled");
    const types = await typesOf(handle.callId, "call.cancelled");
    expect(types.slice(0, 2)).toEqual(["call.admitted", "attempt.started"]);
    expect(types).toContain("call.cancelled");
    // The attempt did not end the call: its end is recorded on its own.
    await typesOf(handle.callId, "attempt.ended");
  });

  it("deadline: admitted, attempt started, deadline exceeded", async () => {
    const handle = client
      .session("s-deadline")
      // Past the second after which a running attempt's start is recorded.
      .submit({ name: "whoami", arguments: { delay_ms: 5_000 } }, { timeoutMs: 1_600 });
    expect((await handle.result).error?.code).toBe("deadline_exceeded");
    const types = await typesOf(handle.callId, "call.deadline_exceeded");
    expect(types.slice(0, 2)).toEqual(["call.admitted", "attempt.started"]);
  });
});

describe("the chain", () => {
  it("three resolvers and an executor writing at once keep one chain, and verify passes", async () => {
    const session = client.session("s-many");
    const handles = Array.from({ length: 60 }, (_, i) =>
      session.submit({ id: `many-${i}`, name: "whoami", arguments: {} }),
    );
    await Promise.all(handles.map((h) => h.result));
    await until("every call's end recorded", async () => {
      const ended = new Set(
        (await trail()).filter((e) => e.type === "call.ended").map((e) => e.call_id),
      );
      return handles.every((h) => ended.has(h.callId));
    });
    const events = await trail();
    expect(events.map((e) => e.seq)).toEqual(events.map((_, i) => i + 1));
    expect(new Set(events.map((e) => e.id)).size).toBe(events.length);
    // The resolvers' admissions interleave in one chain.
    const writers = new Set(events.filter((e) => e.type === "call.admitted").map((e) => e.by));
    expect(writers.size).toBeGreaterThan(1);
    const verified = await runCli(["audit", "verify", "--tenant", "default"], env);
    expect(verified.code).toBe(0);
    expect(verified.stdout.trim()).toBe(`verified ${events.length} events`);
  });

  it("holds no preset secret: the preset the resolver injects is nowhere in the trail", async () => {
    const handle = client
      .session("s-secret")
      .submit({ name: "inspect", arguments: { query: "x" } });
    // The executor hands the preset to the tool, whose result echoes it.
    expect((await handle.result).content).toContain("preset-secret-value");
    await typesOf(handle.callId, "call.ended");
    const exported = await runCli(["audit", "export", "--tenant", "default", "--since", "1h"], env);
    expect(exported.code).toBe(0);
    expect(exported.stdout.split("\n").filter(Boolean).length).toBeGreaterThan(10);
    expect(exported.stdout).not.toContain("preset-secret-value");
  });

  it("records the arguments as the tenant chose: in full, the named pointer redacted", async () => {
    const handle = client.session("s-args").submit({
      name: "inspect",
      arguments: { query: "visible-query", options: { lang: "hidden-lang-value" } },
    });
    expect((await handle.result).content).toContain("hidden-lang-value");
    await typesOf(handle.callId, "call.ended");
    const admitted = (await trail()).find(
      (e) => e.call_id === handle.callId && e.type === "call.admitted",
    );
    expect(admitted?.data).toMatchObject({
      args_hash: expect.stringMatching(/^[0-9a-f]{64}$/) as unknown,
      arguments: { query: "visible-query", limit: 10, options: { deep: true, lang: "[redacted]" } },
    });
    const exported = await runCli(["audit", "export", "--tenant", "default", "--since", "1h"], env);
    expect(exported.stdout).toContain("visible-query");
    expect(exported.stdout).not.toContain("hidden-lang-value");
    expect(exported.stdout).not.toContain("preset-secret-value");
  });

  it("the server refuses deleting or purging an event", async () => {
    const jsm = await jetstreamManager(nc);
    await expect(jsm.streams.deleteMessage(STREAM, 1)).rejects.toThrow();
    await expect(jsm.streams.purge(STREAM)).rejects.toThrow();
    const info = await jsm.streams.info(STREAM);
    expect(info.state.first_seq).toBe(1);
  });
});

describe("a tenant whose audit stream cannot be written", () => {
  it("has its calls refused unavailable (required), not run unrecorded; the same call runs once it can be", async () => {
    const other = new ToolmeshClient(nc, { tenant: "unrecorded", defaultTimeoutMs: 15_000 });
    const submit = () =>
      other.session("s").submit({ name: "whoami", arguments: {} }, { idempotencyKey: "once" });
    const result = await submit().result;
    expect(result.error?.code).toBe("unavailable");
    expect(result.error?.message).toMatch(/audit trail/);
    // Nothing of the call is kept: no record stays in flight for a call that never ran.
    const store = await CallStore.bind(nc, subjects);
    const ref = { address: { tenant: "unrecorded", session: "s" }, idempotency_key: "once" };
    expect(await store.get(ref)).toBeUndefined();
    // Once the tenant's trail can be written, trying again runs it.
    expect((await runCli(["setup", "--tenants", "unrecorded"], env)).code).toBe(0);
    const ran = await eventually(
      "the call tried again runs",
      async () => {
        const call = submit();
        return (await call.result).error === undefined ? call.callId : undefined;
      },
      { timeoutMs: 30_000, everyMs: 500 },
    );
    // Its end is the one stored and recorded: the refusal before it took no id the run needs.
    const stored = await (
      await jetstreamManager(nc)
    ).streams.getMessage(subjects.streams.sessions, {
      last_by_subj: subjects.result({ tenant: "unrecorded", session: "s" }, ran),
    });
    expect(stored?.json<{ error?: unknown; content?: unknown }>()).toMatchObject({
      content: expect.anything(),
    });
    expect(stored?.json<{ error?: unknown }>().error).toBeUndefined();
    await until("the run's end in the trail", async () => {
      for await (const { record } of readTrail(nc, subjects, "unrecorded")) {
        const event = record as AuditRecord;
        if (event.call_id === ran && event.type === "call.ended")
          return event.data.outcome === "ok";
      }
      return false;
    });
  });
});

describe("calls that wait for approval", () => {
  // Calls of `inspect` asking for "gated" wait for the operator; every other call is allowed.
  const POLICY = `@id("all")
permit (principal, action, resource);

@id("gated-needs-operator")
@approval("operator")
permit (principal, action == Toolmesh::Action::"call", resource == Toolmesh::Tool::"inspect")
when { context.args has query && context.args.query == "gated" };
`;

  beforeAll(async () => {
    const store = new PolicyStore(await openPolicyBucket(nc, { subjects }));
    const { revision } = await store.set(POLICY);
    await Promise.all(
      resolvers.map((r) =>
        r.waitForLog(
          (l) => l.msg === "policy set applied" && l.key === "operator" && l.revision === revision,
        ),
      ),
    );
  });

  async function decide(op: "approve" | "deny", callId: string): Promise<void> {
    await until(`${callId} waits for approval`, async () => {
      const out = await runCli(["--tenant", "default", "approvals", "list", "--json"], env);
      return out.stdout.includes(callId);
    });
    const out = await runCli(["--tenant", "default", "approvals", op, callId], env);
    expect(out.code).toBe(0);
  }

  it("approved: the policy decision, the request, the approval, then admitted and run", async () => {
    const handle = client
      .session("s-appr")
      .submit({ id: "appr-1", name: "inspect", arguments: { query: "gated" } });
    await decide("approve", "appr-1");
    expect((await handle.result).error).toBeUndefined();
    const types = await typesOf("appr-1", "call.ended");
    expect(types).toEqual([
      "policy.decided",
      "approval.requested",
      "approval.decided",
      "call.admitted",
      "call.ended",
    ]);
    const decided = (await trail()).find(
      (e) => e.call_id === "appr-1" && e.type === "approval.decided",
    );
    expect(decided?.data).toMatchObject({ decision: "approved", by: "approver:default" });
  });

  it("denied: the request and the denial end the call; never admitted, never run", async () => {
    const handle = client
      .session("s-deny")
      .submit({ id: "deny-1", name: "inspect", arguments: { query: "gated" } });
    await decide("deny", "deny-1");
    expect((await handle.result).error?.code).toBe("approval_denied");
    expect(await typesOf("deny-1", "call.ended")).toEqual([
      "policy.decided",
      "approval.requested",
      "approval.decided",
      "call.ended",
    ]);
    const decided = (await trail()).find(
      (e) => e.call_id === "deny-1" && e.type === "approval.decided",
    );
    expect(decided?.data).toMatchObject({ decision: "denied", by: "approver:default" });
  });
});

describe("a call's end, recorded from its stored final message", () => {
  it("whoever published it; a tenant without a trail and a message that is no final hold nothing up", async () => {
    const js = jetstream(nc);
    const message = {
      role: "tool",
      tool_call_id: "direct-1",
      name: "inspect",
      session_id: "s-direct",
      content: "answered by a path that records nothing itself",
    };
    // A tenant without an audit stream has no trail to record into; a stored message on a final
    // message's subject that is not one is put aside. Neither stops the ends after them.
    await js.publish(
      subjects.result({ tenant: "untracked", session: "s-direct" }, "untracked-1"),
      JSON.stringify({ ...message, tool_call_id: "untracked-1" }),
    );
    await js.publish(subjects.result({ tenant: "default", session: "s-direct" }, "bad-1"), "{");
    // Its end header is unreadable (no service writes one so): the end is read from the body.
    const unreadable = headers();
    unreadable.set(Header.Ended, '{"by":"forger"');
    await js.publish(
      subjects.result({ tenant: "default", session: "s-direct" }, "direct-1"),
      JSON.stringify(message),
      { msgID: "result:direct-1", headers: unreadable },
    );
    expect(await typesOf("direct-1", "call.ended")).toEqual(["call.ended"]);
    const ended = await eventOf("direct-1", "call.ended");
    // Named by the resolver that recorded it, since no publisher named itself on the message.
    expect(ended?.by).toMatch(/^resolver@/);
    expect(ended?.id).toBe("audit:result:direct-1");
    expect(ended?.data).toMatchObject({
      outcome: "ok",
      result_digest: `sha256:${canonicalDigest(message.content)}`,
    });
    expect((await trail()).some((e) => e.call_id === "bad-1")).toBe(false);
    const jsm = await jetstreamManager(nc);
    await until("every final message settled by the resolvers", async () => {
      const info = await jsm.consumers.info(subjects.streams.sessions, subjects.auditEndsConsumer);
      return info.num_pending === 0 && info.num_ack_pending === 0;
    });
  });
});

describe("a stored event rewritten on disk", () => {
  it("is found by verify, which names the first broken link", async () => {
    await killAllServices();
    const before = await trail();
    const target = before.find((e) => e.type === "call.refused");
    expect(target).toBeDefined();
    await nc.close();
    await server.terminate();
    const dir = await streamDir(server.storeDir, STREAM);
    const original = `"code":"unknown_tool"`;
    const forged = `"code":"unknown_tooX"`;
    let rewritten = 0;
    for (const file of (await readdir(dir)).filter((f) => f.endsWith(".blk"))) {
      const path = join(dir, file);
      const bytes = await readFile(path);
      const text = bytes.toString("latin1");
      if (!text.includes(original)) continue;
      await writeFile(path, Buffer.from(text.replace(original, forged), "latin1"));
      rewritten++;
    }
    expect(rewritten).toBe(1);
    await server.restart();
    nc = await connect({ servers: server.url });
    const verified = await runCli(["audit", "verify", "--tenant", "default"], env);
    expect(verified.code).toBe(1);
    // The server notices the block's checksum no longer holds and drops the record on start;
    // the chain names the hole. (A rewrite with a matching checksum fails the event's own hash:
    // see libs/audit/src/chain.test.ts.)
    const seq = target?.seq ?? 0;
    expect(verified.stdout.trim()).toBe(
      `broken link at event ${seq + 1}: event ${seq} is missing (${seq - 1} events before it verified)`,
    );
  });
});

/** Where the server keeps `stream`'s message blocks under its store directory. */
async function streamDir(storeDir: string, stream: string): Promise<string> {
  const found = (await readdir(storeDir, { recursive: true })).find((p) =>
    p.endsWith(join("streams", stream, "msgs")),
  );
  if (found === undefined) throw new Error(`no store of ${stream} under ${storeDir}`);
  return join(storeDir, found);
}
