// The first load of each bucket a service keeps a live copy of, through a link that loses the
// watcher's deliveries: a silent watcher is replaced (said once) instead of hanging the start.
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { Mock } from "vitest";
import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { AccessView, StateStore } from "@toolmesh/catalog";
import { watchLoaded } from "@toolmesh/nats";
import { PolicyStore, PolicyView, openPolicyBucket } from "@toolmesh/policy";
import { createSubjects } from "@toolmesh/protocol";
import type { Subjects } from "@toolmesh/protocol";
import { within } from "./helpers/eventually.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { fromConsumer } from "./helpers/nats-frames.js";
import { startTcpProxy } from "./helpers/tcp-proxy.js";
import type { TcpProxy } from "./helpers/tcp-proxy.js";

let server: NatsServerHandle;
let nc: NatsConnection;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
});

afterAll(async () => {
  await nc?.close();
  await server?.stop();
});

/**
 * A connection that loses its watchers' deliveries until `log.warn` is first called, and that
 * log: the warning of a watcher given up is what lets them through again.
 */
async function lossyLink(): Promise<{
  lossy: NatsConnection;
  proxy: TcpProxy;
  log: { info: () => void; error: () => void; warn: Mock<(obj: object, msg: string) => void> };
}> {
  let losing = true;
  const proxy = await startTcpProxy(server.port, {
    dropDelivered: (message) => losing && fromConsumer(message),
  });
  const lossy = await connect({ servers: `127.0.0.1:${String(proxy.port)}` });
  const warn = vi.fn<(obj: object, msg: string) => void>(() => {
    losing = false;
  });
  return { lossy, proxy, log: { info: () => undefined, error: () => undefined, warn } };
}

function freshSubjects(): Subjects {
  return createSubjects({ prefix: `fl${Math.random().toString(36).slice(2, 8)}` });
}

describe("a watcher that delivers nothing on first load", () => {
  it("is replaced by one that counts the stored entries again (a bucket emptied meanwhile loads at once)", async () => {
    const bucket = `fl${Math.random().toString(36).slice(2, 8)}`;
    await (await new Kvm(nc).create(bucket)).put("a", "1");
    const proxy = await startTcpProxy(server.port, { dropDelivered: fromConsumer });
    const lossy = await connect({ servers: `127.0.0.1:${String(proxy.port)}` });
    try {
      const kv = await new Kvm(lossy).open(bucket);
      const jsm = await jetstreamManager(nc);
      const applied: string[] = [];
      const retries: string[] = [];
      let emptied: Promise<unknown> = Promise.resolve();
      const watcher = await within(
        watchLoaded(kv, (entry) => applied.push(entry.key), {
          what: "load the bucket",
          stallMs: 500,
          onRetry: (kind) => {
            retries.push(kind);
            emptied = jsm.streams.purge(`KV_${bucket}`);
          },
        }),
        10_000,
        "load",
      );
      watcher.stop();
      await emptied;
      expect(retries).toEqual(["timeout"]);
      expect(applied).toEqual([]);
    } finally {
      await lossy.close();
      await proxy.close();
    }
  });

  it("is replaced, with one warning, for the policy sets", async () => {
    const subjects = freshSubjects();
    await new PolicyStore(await openPolicyBucket(nc, { subjects })).set(
      '@id("all")\npermit (principal, action, resource);\n',
    );
    const { lossy, proxy, log } = await lossyLink();
    try {
      const view = await PolicyView.open(lossy, { subjects, log, stallMs: 500 });
      view.close();
      expect(log.warn).toHaveBeenCalledTimes(1);
      expect(log.warn.mock.calls[0]).toEqual([
        expect.objectContaining({
          kind: "timeout",
          reason:
            "the watcher to load the policy sets delivered nothing for 500 ms after 0 entries",
        }),
        "bucket cannot be read yet (timeout); trying again",
      ]);
      expect(view.decider.scope()?.revision).toBeGreaterThan(0);
    } finally {
      await lossy.close();
      await proxy.close();
    }
  });

  it("is replaced, with one warning, for the tool-group state", async () => {
    const subjects = freshSubjects();
    const store = await StateStore.open(nc, { subjects });
    await store.updateTenantGroups("acme", () => ({
      groups: new Map([["admin", false]]),
      updated_at: Date.now(),
    }));
    const { lossy, proxy, log } = await lossyLink();
    try {
      const lossyStore = await StateStore.open(lossy, { subjects });
      const view = await AccessView.open(lossy, lossyStore, {
        agents: new Map(),
        log,
        stallMs: 500,
      });
      view.close();
      expect(log.warn).toHaveBeenCalledTimes(1);
      expect(log.warn.mock.calls[0]).toEqual([
        expect.objectContaining({
          kind: "timeout",
          reason: expect.stringMatching(/delivered nothing for 500 ms after 0 entries/),
        }),
        "bucket cannot be read yet (timeout); trying again",
      ]);
      expect(view.tenantGroups("acme")?.get("admin")).toBe(false);
    } finally {
      await lossy.close();
      await proxy.close();
    }
  });
});
