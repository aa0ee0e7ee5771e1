import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { MeshCallPlane } from "@toolmesh/call-store";
import { callRecordOf, openCallPlane } from "@toolmesh/call-store";
import { deadlineHeaders, followedResults } from "@toolmesh/control-plane";
import type { DeadlineKeeper, FinalSeen } from "@toolmesh/control-plane/internal";
import { startDeadlineKeeper } from "@toolmesh/control-plane/internal";
import { publishDurable } from "@toolmesh/nats";
import type { ResolvedCall, Subjects, ToolMessage } from "@toolmesh/protocol";
import { Header, createSubjects, decodeJson } from "@toolmesh/protocol";
import { createLogger } from "@toolmesh/telemetry";
import { connectionCounters, startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { resolvedCall, routeAsResolver } from "./helpers/calls.js";
import { collect } from "./helpers/collect.js";

// What the deadline keeper follows (ADR 0066): the headers the work and sessions streams
// republish (TOOLMESH_REPUBLISH_HEADS=on), or, for streams made without that, the stored
// subjects, bodies and all. Either way it ends a call at its deadline and
// sees every final message; only the headers spare it the bodies. Run on both server versions.

const log = createLogger({ service: "test", level: "silent" });
const address = { tenant: "default", session: "s" };
const BIG = 256 * 1024;
let server: NatsServerHandle;
const open: NatsConnection[] = [];
const keepers: DeadlineKeeper[] = [];
let n = 0;

beforeAll(async () => {
  server = await startNatsServer();
}, 30_000);

afterAll(async () => {
  for (const k of keepers) k.stop();
  for (const conn of open) await conn.close().catch(() => undefined);
  await server?.stop();
});

/** A mesh of streams under `prefix`; `bodies`: its work and sessions streams republish nothing. */
async function mesh(
  prefix: string,
  bodies: boolean,
): Promise<{ s: Subjects; plane: MeshCallPlane }> {
  const s = createSubjects({ prefix });
  const nc = await connect({ servers: server.url });
  open.push(nc);
  const plane = await openCallPlane(nc, {
    subjects: s,
    streamLimits: { republishHeads: !bodies },
  });
  return { s, plane };
}

/**
 * A keeper whose subscriptions are on a connection of its own, named `name` (it reads through
 * `plane`, which sets no stream up again), and the final messages it saw.
 */
async function keeper(
  s: Subjects,
  plane: MeshCallPlane,
  name: string,
): Promise<{ k: DeadlineKeeper; seen: FinalSeen[] }> {
  const conn = await connect({ servers: server.url, name });
  open.push(conn);
  const seen: FinalSeen[] = [];
  const k = await startDeadlineKeeper(
    { nc: conn, plane, subjects: s, log },
    { onResult: (result) => seen.push(result) },
  );
  keepers.push(k);
  await k.replay();
  return { k, seen };
}

/** Server → client bytes of one named connection. */
async function outBytes(name: string): Promise<number> {
  return (await connectionCounters(server, name)).out_bytes ?? 0;
}

/** Records and routes a call with `BIG` bytes of arguments, as the resolver does. */
async function route(s: Subjects, plane: MeshCallPlane, timeoutMs: number): Promise<ResolvedCall> {
  const c = resolvedCall({
    id: `c${++n}`,
    tool: "idle",
    address,
    now: plane.clock.now(),
    timeoutMs,
    arguments: { text: "x".repeat(BIG) },
  });
  await routeAsResolver(plane, s, c);
  return c;
}

describe.each([
  { feed: "the streams' republished headers", bodies: false },
  { feed: "the stored subjects, for streams that republish nothing", bodies: true },
])("the deadline keeper following $feed", ({ bodies }) => {
  it("ends a call at its deadline, and sees a call that ends in time end, with its size and tool", async () => {
    const prefix = bodies ? "bodies" : "heads";
    const { s, plane } = await mesh(prefix, bodies);
    const name = `keeper-${prefix}`;
    const { k, seen } = await keeper(s, plane, name);
    const watcher = await connect({ servers: server.url });
    open.push(watcher);
    const results = collect(watcher, s.allResults);
    await watcher.flush();
    const late = await route(s, plane, 1_500);
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    expect((decodeJson(results[0]!.data) as ToolMessage).error?.code).toBe("deadline_exceeded");
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(1);
    expect(seen[0]?.subject).toBe(s.result(address, late.call_id));
    expect(seen[0]?.tool()).toBe("idle");

    // A call that ends in time with a large result: what reaches the keeper's connection.
    const before = await outBytes(name);
    const c = await route(s, plane, 60_000);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(1);
    const done = { ...finalOf(c), content: "y".repeat(BIG) };
    expect(await plane.finalize(c, done)).toBe(true);
    await expect.poll(() => k.watched, { timeout: 5_000 }).toBe(0);
    expect(seen[1]?.bytes).toBeGreaterThan(BIG);
    expect(seen[1]?.tool()).toBe("idle");
    const moved = (await outBytes(name)) - before;
    if (bodies) expect(moved).toBeGreaterThan(2 * BIG);
    else expect(moved).toBeLessThan(16 * 1024);
  });
});

function finalOf(c: ResolvedCall): ToolMessage {
  return {
    role: "tool",
    tool_call_id: c.call_id,
    name: c.tool,
    content: "",
    session_id: c.session_id,
  };
}

describe("the deadline keeper following the stored subjects", () => {
  it("takes a work message's own subject and sequence, whatever republish headers it carries", async () => {
    const { s, plane } = await mesh("forged", true);
    await keeper(s, plane, "keeper-forged");
    const watcher = await connect({ servers: server.url });
    open.push(watcher);
    const results = collect(watcher, s.allResults);
    await watcher.flush();
    const c = resolvedCall({
      id: "forged",
      tool: "idle",
      address,
      now: plane.clock.now(),
      timeoutMs: 1_500,
    });
    await plane.store.accept({ ...callRecordOf(c, "h") });
    // Headers only a stream's republish sets, pointing at another owner's stream.
    const headers = deadlineHeaders(c);
    headers.set(Header.RepublishedSubject, s.work("idle", "ghost"));
    headers.set(Header.RepublishedSequence, "999999");
    const { seq } = await publishDurable(plane.js, s.work(c.tool), c, { headers });
    await expect.poll(() => results.length, { timeout: 10_000 }).toBe(1);
    // Ended, and its work found where it is and removed.
    await expect
      .poll(async () => (await plane.jsm.streams.getMessage(s.streams.work, { seq })) !== null, {
        timeout: 5_000,
      })
      .toBe(false);
  });
});

describe("TOOLMESH_REPUBLISH_HEADS turned on over streams made without it", () => {
  it("adds the republish where the server can (2.10+), else keeps the streams and the keeper reads bodies", async () => {
    const { s } = await mesh("turned-on", true);
    const nc = await connect({ servers: server.url });
    open.push(nc);
    // What every service does at start with the setting on: never a failure.
    const plane = await openCallPlane(nc, { subjects: s, streamLimits: { republishHeads: true } });
    const [major, minor] = (nc.info?.version ?? "0.0").split(".").map(Number);
    const adds = (major ?? 0) > 2 || ((major ?? 0) === 2 && (minor ?? 0) >= 10);
    for (const name of [s.streams.work, s.streams.sessions]) {
      const { config } = await plane.jsm.streams.info(name);
      expect(config.republish?.headers_only === true).toBe(adds);
    }
    expect(await followedResults({ plane, subjects: s })).toBe(
      adds ? s.allResultHeads : s.allResults,
    );
  });
});
