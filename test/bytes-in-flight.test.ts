import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { ServiceProcess } from "./helpers/mesh.js";
import { fixtureTools, killAllServices, startService, toolAvailable } from "./helpers/mesh.js";

// A tenant's bytes in flight, against TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT: a tenant flooding a
// tool with large results has its further calls held by the resolver (not refused) while its
// bytes are up; another tenant's small calls to the same tool go straight through; every call of
// both ends with its result. Fair share's window is off, so only the bytes hold calls.

const RESULT = 60_000;
const BOUND = 150_000;
const HELD = "tool busy; call held for its fair turn";

let server: NatsServerHandle;
let nc: NatsConnection;
let resolver: ServiceProcess;

beforeAll(async () => {
  server = await startNatsServer();
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: fixtureTools("tools-bytes"),
    TOOLMESH_FAIR_SHARE_WINDOW: "0",
    TOOLMESH_TENANT_MAX_BYTES_IN_FLIGHT: String(BOUND),
    TOOLMESH_LOG_LEVEL: "debug",
  };
  resolver = await startService("resolver", env);
  await startService("executor", { ...env, TOOLMESH_CONCURRENCY: "32" });
  await toolAvailable(resolver, "bulky");
  nc = await connect({ servers: server.url });
}, 60_000);

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await server?.stop();
});

function resultOf(m: ToolMessage): { seen: number; text: string } {
  expect(m.error).toBeUndefined();
  return JSON.parse(m.content) as { seen: number; text: string };
}

function heldIds(): Set<unknown> {
  return new Set(resolver.lines.filter((l) => l.msg === HELD).map((l) => l.callId));
}

describe("a tenant's bytes in flight", () => {
  it("holds a tenant flooding large results while another tenant's small calls go through", async () => {
    const a = new ToolmeshClient(nc, { tenant: "flood" }).session("s-a");
    const b = new ToolmeshClient(nc, { tenant: "quiet" }).session("s-b");
    const bulky = (tag: string, id: string, size: number, holdMs: number) => ({
      id,
      name: "bulky",
      arguments: { size, hold_ms: holdMs, tag },
    });
    // One call teaches the resolver what the flooding tenant's results of the tool weigh (before
    // it, a call is weighed by its arguments alone, here small).
    resultOf(await a.submit(bulky("warm", "a-warm", RESULT, 0)).result);

    const ids = Array.from({ length: 12 }, (_, i) => `a-${i}`);
    const aEnded: number[] = [];
    const aResults = ids.map((id) =>
      a.submit(bulky("a", id, RESULT, 400)).result.then((m) => (aEnded.push(Date.now()), m)),
    );
    // Readiness, not a sleep: B starts once A's calls are being held.
    await resolver.waitForLog(() => heldIds().size >= 6, 20_000);
    const bIds = ["b-0", "b-1", "b-2"];
    const bResults = await Promise.all(
      bIds.map((id) =>
        b.submit(bulky("b", id, 10, 50)).result.then((m) => [m, Date.now()] as const),
      ),
    );
    const aMessages = await Promise.all(aResults);
    a.close();
    b.close();

    // Nothing lost: every call of both tenants ended with its result.
    const aDone = aMessages.map(resultOf);
    expect(aDone.every((r) => r.text.length === RESULT)).toBe(true);
    for (const [m] of bResults) expect(resultOf(m).text).toHaveLength(10);
    // A's calls were held, never more than its bound lets run at once: 150 000 bytes of calls
    // weighing ~60 000 each start while fewer than 150 000 are in flight — three.
    const held = heldIds();
    expect(ids.filter((id) => held.has(id)).length).toBeGreaterThanOrEqual(6);
    expect(Math.max(...aDone.map((r) => r.seen))).toBeLessThanOrEqual(3);
    // B's were never held, and were done while A still had calls waiting.
    expect(bIds.filter((id) => held.has(id))).toEqual([]);
    const lastA = Math.max(...aEnded);
    for (const [, at] of bResults) expect(at).toBeLessThan(lastA);
  }, 60_000);
});
