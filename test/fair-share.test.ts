import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { QuotaStore } from "@toolmesh/catalog";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

// With defaults (no window set): one executor runs 4 calls at once and announces it; the
// resolvers hold calls beyond that window of 4 outstanding and hand them on in round-robin order
// among tenants.

let server: NatsServerHandle;
let nc: NatsConnection;
let env: Record<string, string>;
let resolvers: ServiceProcess[] = [];
let executor: ServiceProcess;

beforeAll(async () => {
  server = await startNatsServer();
  env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-c"),
    // Twice the default: on a loaded machine a tenant's next call may reach the resolver more
    // than the default second after its last call ended, and the kept slot would be gone.
    TOOLMESH_FAIR_SHARE_IDLE_MS: "2000",
    TOOLMESH_ACK_WAIT_MS: "2000",
    TOOLMESH_LOG_LEVEL: "debug",
  };
  const resolver = await startService("resolver", env);
  resolvers = [resolver];
  executor = await startService("executor", { ...env, TOOLMESH_CONCURRENCY: "4" });
  await toolAvailable(resolver, "concurrency");
  await replicasHeard(resolver, 1);
  nc = await connect({ servers: server.url });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

function submitMany(
  tenant: string,
  tag: string,
  count: number,
  holdMs: number,
  timeoutMs?: number,
) {
  const session = new ToolmeshClient(nc, { tenant }).session(`s-${tag}`);
  const handles = Array.from({ length: count }, (_, i) =>
    session.submit(
      { id: `${tag}-${i}`, name: "concurrency", arguments: { hold_ms: holdMs } },
      timeoutMs === undefined ? {} : { timeoutMs },
    ),
  );
  return { session, handles };
}

const HELD = "tool busy; call held for its fair turn";

/** Resolves once `resolver` has heard `count` executor replicas announce their capacity. */
async function replicasHeard(resolver: ServiceProcess | undefined, count: number): Promise<void> {
  await resolver?.waitForLog(
    () => resolver.lines.filter((l) => l.msg === "replica capacity heard").length >= count,
    20_000,
  );
}

function heldSoFar(resolver: ServiceProcess | undefined): number {
  return resolver?.lines.filter((l) => l.msg === HELD).length ?? 0;
}

/** Resolves once `count` more calls than `since` were held (readiness, not a sleep). */
async function heldCalls(
  resolver: ServiceProcess | undefined,
  since: number,
  count: number,
): Promise<void> {
  await resolver?.waitForLog(() => heldSoFar(resolver) >= since + count, 20_000);
}

/** Resolves once the calls `ids` were held. */
async function held(resolver: ServiceProcess | undefined, ids: string[]): Promise<void> {
  const isHeld = (id: string) => resolver?.lines.some((l) => l.msg === HELD && l.callId === id);
  await resolver?.waitForLog(() => ids.every(isHeld), 20_000);
}

describe("fair share of a busy tool", () => {
  // First: no other tenant was seen at the tool within the idle time, so none keeps a slot.
  it("keeps a slot free for a tenant whose call just ended, so its next call starts at once", async () => {
    const HOLD_MS = 1_500;
    const finished: string[] = [];
    const mark = heldSoFar(resolvers[0]);
    const a = submitMany("backlog", "ka", 20, HOLD_MS);
    const aResults = a.handles.map((h) => h.result.then((m) => (finished.push("A"), m)));
    await heldCalls(resolvers[0], mark, 8);
    // B's first call waits for a slot; when it ends, B has nothing running and its slot is kept
    // (for the idle time, 2 s here): its second call starts at once, beside A's three, instead of
    // after one of A's.
    const b = new ToolmeshClient(nc, { tenant: "interactive" }).session("s-kb");
    const call = (id: string) =>
      b.submit({ id, name: "concurrency", arguments: { hold_ms: HOLD_MS } }).result;
    const first = await call("kb-0");
    // As an agent does, B thinks a little before its next call: A's calls that ended with B's
    // have been replaced by then, so only a kept slot lets B's call start before one of A's ends.
    await new Promise((resolve) => setTimeout(resolve, 300));
    const second = await call("kb-1");
    const aBeforeSecond = finished.length;
    const aMessages = await Promise.all(aResults);
    a.session.close();
    b.close();
    expect([first.error, second.error]).toEqual([undefined, undefined]);
    expect(aMessages.every((m) => m.error === undefined)).toBe(true);
    // A's four first calls, then three slots for 2 × 1.5 s (and B's pause) while B's two calls
    // ran: at most 4 + 3 × 2 of A's ended first. Had B's second call waited for one of A's to
    // end, A would have had four slots meanwhile (at least 11).
    expect(aBeforeSecond).toBeLessThanOrEqual(10);
  });

  it("serves a second tenant in turn instead of after the first tenant's backlog", async () => {
    const finished: string[] = [];
    const track = (tenant: string, handles: { result: Promise<ToolMessage> }[]) =>
      handles.map((h) =>
        h.result.then((m) => {
          finished.push(tenant);
          return m;
        }),
      );
    const mark = heldSoFar(resolvers[0]);
    const a = submitMany("flood", "fa", 40, 200);
    const aResults = track("A", a.handles);
    await heldCalls(resolvers[0], mark, 20);
    const b = submitMany("steady", "fb", 4, 200);
    const bResults = track("B", b.handles);
    const bMessages = await Promise.all(bResults);
    const aMessages = await Promise.all(aResults);
    a.session.close();
    b.session.close();
    expect(bMessages.every((m) => m.error === undefined)).toBe(true);
    expect(aMessages.every((m) => m.error === undefined)).toBe(true);
    // In arrival order B would finish after all 40 of A's; in turn, after a few rounds.
    const aBeforeLastB = finished.slice(0, finished.lastIndexOf("B")).filter((t) => t === "A");
    expect(aBeforeLastB.length).toBeLessThan(16);
  });

  it("answers a held call at its deadline and a cancelled one at once, and runs neither", async () => {
    const mark = heldSoFar(resolvers[0]);
    const backlog = submitMany("busy", "bl", 24, 300);
    await heldCalls(resolvers[0], mark, 16);
    // Behind their own tenant's backlog, these wait for many rounds.
    const late = submitMany("busy", "lt", 1, 300, 600);
    const cancelled = submitMany("busy", "cc", 1, 300);
    await held(resolvers[0], ["lt-0", "cc-0"]);
    const reply = await cancelled.handles[0]?.cancel();
    expect(reply?.cancelled).toBe(true);
    const [lateMessage, cancelMessage] = await Promise.all([
      late.handles[0]?.result,
      cancelled.handles[0]?.result,
    ]);
    expect(lateMessage?.error?.code).toBe("deadline_exceeded");
    expect(lateMessage?.attempts).toBe(0);
    expect(cancelMessage?.error?.code).toBe("cancelled");
    const rest = await Promise.all(backlog.handles.map((h) => h.result));
    expect(rest.every((m) => m.error === undefined)).toBe(true);
    // The executor never saw either call.
    expect(executor.lines.filter((l) => l.callId === "lt-0" || l.callId === "cc-0")).toEqual([]);
    expect(executor.lines.some((l) => l.callId === "bl-0")).toBe(true);
    for (const s of [backlog, late, cancelled]) s.session.close();
  });

  it("refuses calls over max_queued while the tool is busy, and admits the rest in turn", async () => {
    const store = await QuotaStore.open(nc, { subjects: createSubjects() });
    await store.set({ tenant: "queued" }, { max_queued: 5 });
    await resolvers[0]?.waitForLog((l) => l.msg === "quota applied" && l.quota === "queued");
    const mark = heldSoFar(resolvers[0]);
    // Long enough that no slot frees while the flood arrives: each held call of "queued" stays held.
    const backlog = submitMany("other", "ob", 12, 2_000);
    await heldCalls(resolvers[0], mark, 6);
    const flood = submitMany("queued", "qd", 20, 10);
    const messages = await Promise.all(flood.handles.map((h) => h.result));
    const refused = messages.filter((m) => m.error !== undefined);
    expect(messages.filter((m) => m.error === undefined)).toHaveLength(5);
    expect(refused).toHaveLength(15);
    expect(refused[0]?.error).toMatchObject({
      code: "quota_exceeded",
      retryable: true,
      details: { quota: "max_queued", limit: 5, scope: "queued" },
    });
    await Promise.all(backlog.handles.map((h) => h.result));
    for (const s of [backlog, flood]) s.session.close();
    // Counted out as their final messages go by.
    for (let i = 0; (await store.usage({ tenant: "queued" })).in_flight > 0; i++) {
      expect(i).toBeLessThan(100);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(await store.usage({ tenant: "queued" })).toMatchObject({ in_flight: 0, queued: 0 });
  });

  it("loses no held call when its resolver dies", async () => {
    resolvers.push(await startService("resolver", env));
    const victim = resolvers[0];
    const mark = heldSoFar(victim);
    const flood = submitMany("killed", "kd", 30, 150);
    await heldCalls(victim, mark, 10);
    await victim?.kill();
    const messages = await Promise.all(flood.handles.map((h) => h.result));
    flood.session.close();
    expect(messages.filter((m) => m.error !== undefined)).toEqual([]);
    expect(messages).toHaveLength(30);
  });

  it("keeps serving a second tenant in turn while executor replicas come and go", async () => {
    // The one still alive when the whole file runs.
    const resolver = resolvers.at(-1);
    if (resolver === undefined) throw new Error("no resolver");
    const finished: string[] = [];
    const track = (tenant: string, handles: { result: Promise<ToolMessage> }[]) =>
      handles.map((h) =>
        h.result.then((m) => {
          finished.push(tenant);
          return m;
        }),
      );
    await replicasHeard(resolver, 1);
    const mark = heldSoFar(resolver);
    const a = submitMany("churn-a", "ca", 40, 200);
    const aResults = track("A", a.handles);
    await heldCalls(resolver, mark, 20);
    // A replica added: the window grows to 8 once the resolver hears it.
    const added = await startService("executor", { ...env, TOOLMESH_CONCURRENCY: "4" });
    await replicasHeard(resolver, 2);
    // The first replica dies (no farewell): it stops counting within three announcement periods,
    // and its calls are redelivered to the new one after the ack wait.
    await executor.kill();
    // The resolver finds the dead replica's announcement too old when it next looks at the
    // tool's window: a probe tenant's calls, one at a time, make it look.
    let expired = false;
    const expiry = resolver
      .waitForLog((l) => l.msg === "replica capacity expired", 20_000)
      .then(() => (expired = true));
    const probe = new ToolmeshClient(nc, { tenant: "churn-probe" }).session("s-probe");
    for (let i = 0; !expired; i++)
      await probe.submit({ id: `p-${i}`, name: "concurrency", arguments: { hold_ms: 10 } }).result;
    await expiry;
    probe.close();
    // A floods on; B's calls come behind all of it.
    const moreMark = heldSoFar(resolver);
    const more = submitMany("churn-a", "cm", 60, 200);
    const moreResults = track("A", more.handles);
    await heldCalls(resolver, moreMark, 30);
    const b = submitMany("churn-b", "cb", 4, 200);
    const bResults = track("B", b.handles);
    const bMessages = await Promise.all(bResults);
    const aMessages = await Promise.all([...aResults, ...moreResults]);
    for (const s of [a, more, b]) s.session.close();
    expect(bMessages.every((m) => m.error === undefined)).toBe(true);
    expect(aMessages.every((m) => m.error === undefined)).toBe(true);
    // In arrival order B would finish after all of A's second wave; in turn, after a few rounds
    // of the surviving replica's 4 slots. Only the added replica is left to run them.
    const aAfterLastB = finished.slice(finished.lastIndexOf("B")).filter((t) => t === "A");
    expect(aAfterLastB.length).toBeGreaterThan(30);
    expect(added.lines.some((l) => String(l.callId).startsWith("cb-"))).toBe(true);
  }, 120_000);
});
