import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { MeshCredentialLimits } from "@toolmesh/gateway";
import { connectNats } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import { eventually } from "./helpers/eventually.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// Mesh-wide per-credential limits (TOOLMESH_GATEWAY_LIMITS=mesh) when the end of a request
// cannot be written at once: the server is away when the request ends.

const subjects = createSubjects();
let server: NatsServerHandle;
let nc: NatsConnection;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connectNats({ servers: server.url, name: "limits-outage-test" });
  await new Kvm(nc).create(subjects.quotaUsageBucket);
});

afterAll(async () => {
  await nc?.close().catch(() => undefined);
  await server?.stop();
});

describe("a request that ends while the server is away", () => {
  it("gives its slot back once the server is back, not when its hold ends", async () => {
    const warnings: string[] = [];
    const limits = await MeshCredentialLimits.open(nc, subjects, {
      maxConcurrent: 1,
      ratePerS: 0,
      burst: 0,
      holdMs: 120_000,
      log: { warn: (_obj: object, msg?: string) => void warnings.push(String(msg)) },
    });
    const release = await limits.enter("acme", "key-1");
    expect(typeof release).toBe("function");
    expect(await limits.enter("acme", "key-1")).toMatchObject({ reason: "concurrency" });

    await server.kill();
    (release as () => void)();
    // Longer than a request waits for its answer: the first write of the end has failed.
    await eventually("the end's first write failed", () => warnings[0], { timeoutMs: 20_000 });
    expect(warnings[0]).toMatch(/could not be written yet; trying again/);
    await server.restart();

    const next = await eventually(
      "the credential's slot free again",
      async () => {
        const admitted = await limits.enter("acme", "key-1").catch(() => undefined);
        return typeof admitted === "function" ? admitted : undefined;
      },
      { timeoutMs: 30_000, everyMs: 500 },
    );
    next();
  }, 90_000);
});
