import { setImmediate as nextTurn } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
import { ensureStreams } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import { StoredBytes } from "@toolmesh/resolver/internal";
import { createLogger } from "@toolmesh/telemetry";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// A resolver's count of what each tenant's calls stored (docs/quotas.md, "Results, per
// tenant"), against a real server's KV bucket: what admission and the metrics read of it.

const subjects = createSubjects();
let server: NatsServerHandle;
let nc: NatsConnection;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  await new Kvm(nc).create(subjects.quotaUsageBucket);
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

async function ledger(results = subjects.allResults): Promise<StoredBytes> {
  return StoredBytes.open({
    nc,
    subjects,
    results,
    usage: await new Kvm(nc).open(subjects.quotaUsageBucket),
    boundOf: () => undefined,
    defaultBound: 1_000,
    windowMs: 60_000,
    // Written only when the test says so.
    flushMs: 3_600_000,
    now: () => Date.now(),
    log: createLogger({ service: "test", level: "silent" }),
  });
}

describe("a resolver's count of stored results", () => {
  it("keeps counting bytes while they are written, so a tenant at its bound stays refused", async () => {
    const counted = await ledger();
    try {
      counted.add("acme", 600);
      counted.add("acme", 600);
      expect(counted.stored("acme").bytes).toBe(1_200);
      const written = counted.flush();
      // The write is under way (its request sent, not answered): the bytes are still counted.
      await nextTurn();
      expect(counted.stored("acme").bytes).toBe(1_200);
      expect(counted.refusal("acme")?.details).toMatchObject({ quota: "storage" });
      await written;
      // Written: counted once, from the entry this resolver wrote, before its watch sees it.
      expect(counted.stored("acme").bytes).toBe(1_200);
      expect(counted.readings()).toEqual([{ tenant: "acme", bytes: 1_200, bound: 1_000 }]);
    } finally {
      await counted.close();
    }
    // Another resolver reads the same from the bucket.
    const other = await ledger();
    try {
      expect(other.stored("acme").bytes).toBe(1_200);
    } finally {
      await other.close();
    }
  });

  it("counts each final message by its size, from the headers the sessions stream republishes", async () => {
    await ensureStreams(nc, subjects, { republishHeads: true });
    const counted = await ledger(subjects.allResultHeads);
    try {
      const js = jetstream(nc);
      const at = { tenant: "initech", session: "s1" };
      await js.publish(subjects.result(at, "c1"), new Uint8Array(4_321));
      await js.publish(subjects.result(at, "c2"), new Uint8Array(79));
      await expect.poll(() => counted.stored("initech").bytes).toBe(4_400);
    } finally {
      await counted.close();
    }
  });
});
