import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { scanBucket } from "@toolmesh/nats";
import { createSubjects, decodeJson, settledWithin } from "@toolmesh/protocol";
import {
  KEYS,
  gatewayAgents,
  gatewayTools,
  modernPost,
  startGateway,
  writeKeysFile,
} from "./helpers/gateway.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import type { RoundRobinProxy } from "./helpers/round-robin-proxy.js";
import { startRoundRobinProxy } from "./helpers/round-robin-proxy.js";
import { until } from "./helpers/eventually.js";

// Per-credential limits shared by three gateway replicas behind a round-robin balancer
// (TOOLMESH_GATEWAY_LIMITS=mesh): a credential gets the figures once in all, not once per replica.
// Counts over a window, with margin; no timing of single requests.

const RATE = 10;
const BURST = 20;
const MAX_CONCURRENT = 6;

let server: NatsServerHandle;
let proxy: RoundRobinProxy;

/** One 2026-07-28 request through the balancer: the HTTP status. */
async function post(key: string, method: string, params: Record<string, unknown>): Promise<number> {
  const response = await modernPost(proxy.url, key, method, params);
  await response.arrayBuffer();
  return response.status;
}

/** The requests in flight the replicas' shared usage entries hold, over every credential. */
async function slotsHeld(): Promise<number> {
  const nc = await connect({ servers: server.url });
  try {
    // Message gets, no consumer: nothing of the probe itself can wait for long.
    const entries = await scanBucket(
      await jetstreamManager(nc),
      createSubjects().quotaUsageBucket,
      "gateway.>",
    );
    let held = 0;
    for (const entry of entries) {
      const usage = decodeJson(entry.value) as { in_flight?: Record<string, number> } | null;
      held += Object.keys(usage?.in_flight ?? {}).length;
    }
    return held;
  } finally {
    await nc.close();
  }
}

/** A tools/call through the balancer: the HTTP status. */
function call(key: string, name: string, args: Record<string, unknown>): Promise<number> {
  return post(key, "tools/call", { name, arguments: args });
}

beforeAll(async () => {
  server = await startNatsServer();
  const [tools, configs, keys] = await Promise.all([
    gatewayTools(),
    gatewayAgents(),
    writeKeysFile(),
  ]);
  const env = {
    NATS_URL: server.url,
    TOOLMESH_TOOLS_DIR: tools,
    TOOLMESH_CONFIG_DIR: configs,
    TOOLMESH_TOOLKIT_CONTEXT: JSON.stringify({ ledgerDir: tools }),
  };
  const [resolver] = await Promise.all([
    startService("resolver", env, 60_000),
    startService("executor", env, 60_000),
    startService("schema-expander", env, 60_000),
  ]);
  await toolAvailable(resolver, "echo", "slow");
  const gatewayEnv = {
    ...env,
    ...keys.env,
    TOOLMESH_GATEWAY_KEYS_FILE: keys.file,
    TOOLMESH_GATEWAY_LIMITS: "mesh",
    TOOLMESH_GATEWAY_RATE_PER_S: String(RATE),
    TOOLMESH_GATEWAY_RATE_BURST: String(BURST),
    TOOLMESH_GATEWAY_MAX_CONCURRENT: String(MAX_CONCURRENT),
  };
  const replicas = await Promise.all([0, 1, 2].map(() => startGateway(gatewayEnv)));
  proxy = await startRoundRobinProxy(replicas.map((r) => r.port));
}, 180_000);

afterAll(async () => {
  await proxy?.close();
  await killAllServices();
  await server?.stop();
});

describe("mesh-wide per-credential limits over three replicas", () => {
  it("admits the credential's rate once in all, not once per replica", async () => {
    const windowMs = 3_000;
    const statuses: number[] = [];
    const hitsBefore = new Map(proxy.hits);
    const started = Date.now();
    const count = (status: number) => statuses.filter((s) => s === status).length;
    // Two callers as fast as they are answered, round-robin over the replicas; every request
    // counts (server/discover asks the mesh nothing, so the callers outrun the rate, and stay
    // below the concurrency). At least `windowMs`, and on a slow machine until they have been
    // refused more often than admitted: the bound is only tested once the callers outran it.
    const going = () => {
      const elapsed = Date.now() - started;
      return elapsed < windowMs || (count(429) <= count(200) && elapsed < 20_000);
    };
    await Promise.all(
      Array.from({ length: 2 }, async () => {
        while (going()) statuses.push(await post(KEYS.acme, "server/discover", {}));
      }),
    );
    const elapsedS = (Date.now() - started) / 1_000;
    const admitted = count(200);
    const refused = count(429);
    expect(admitted + refused).toBe(statuses.length);
    // One bucket: its burst and its refill over the window (per-replica buckets: three times it).
    const allowed = BURST + RATE * elapsedS;
    expect(admitted).toBeLessThanOrEqual(Math.ceil(allowed) + 3);
    expect(admitted).toBeGreaterThanOrEqual(BURST);
    // The callers asked for far more than the limit: what was not admitted was refused with 429.
    expect(refused).toBeGreaterThan(admitted);
    // Every replica took its share of the requests.
    for (const [port, hits] of proxy.hits)
      expect(hits - (hitsBefore.get(port) ?? 0)).toBeGreaterThan(statuses.length / 6);
  }, 45_000);

  it("admits the credential's concurrency once in all", async () => {
    const calls = Promise.all(
      Array.from({ length: 2 * MAX_CONCURRENT }, () =>
        call(KEYS.acmeWriter, "slow", { ms: 2_000, value: "c" }),
      ),
    );
    expect(await settledWithin(calls, 20_000), "every request answered").toBe(true);
    const statuses = await calls;
    expect(statuses.filter((s) => s === 200)).toHaveLength(MAX_CONCURRENT);
    expect(statuses.filter((s) => s === 429)).toHaveLength(MAX_CONCURRENT);
    // Ended requests give their slots back: the next ones are admitted. A replica gives a slot
    // back in a write of its own, which may land just after the answer went out.
    await until("every slot of the credential given back", async () => (await slotsHeld()) === 0);
    const after = await Promise.all(
      Array.from({ length: MAX_CONCURRENT }, () =>
        call(KEYS.acmeWriter, "slow", { ms: 10, value: "c" }),
      ),
    );
    expect(after).toEqual(Array.from({ length: MAX_CONCURRENT }, () => 200));
    // Past the waits above, so that a failure names the step that did not happen.
  }, 60_000);
});
