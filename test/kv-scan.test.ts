import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connectNats, scanBucket } from "@toolmesh/nats";
import { createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { QuotaStore } from "@toolmesh/catalog";
import { CallStore } from "@toolmesh/call-store";
import type { NatsClusterHandle } from "@toolmesh/nats-launcher";
import { waitForStreamLeader } from "@toolmesh/nats-launcher";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestCluster } from "./helpers/nats-server.js";

// Listing a bucket's entries without a consumer (`scanBucket`), on a 3-node cluster with the
// bucket's leader killed: nats-server 2.9 then fails to make the consumer `kv.keys()` needs
// about 40 % of the time, for as long as the node stays down. The tests run in order: the
// first kills a node, the next read with it still down.

let cluster: NatsClusterHandle;
let nc: NatsConnection;
let registry: ToolRegistry;
let quotas: QuotaStore;
let calls: CallStore;
const REGISTRY_STREAM = `KV_${createSubjects({ prefix: "scan" }).registryBucket}`;
const QUOTAS_STREAM = `KV_${createSubjects({ prefix: "scan" }).quotasBucket}`;
const CALLS_STREAM = `KV_${createSubjects({ prefix: "scan" }).callsBucket}`;

beforeAll(async () => {
  cluster = await startTestCluster({
    size: 3,
  });
  nc = await connectNats({ servers: cluster.urls, name: "kv-scan-test" });
  // Made while every node is up: a bucket of three replicas cannot be placed with one down.
  registry = await ToolRegistry.open(nc, {
    subjects: createSubjects({ prefix: "scan" }),
    log: { warn: () => undefined },
    replicas: 3,
    watch: false,
  });
  await waitForStreamLeader(nc, REGISTRY_STREAM);
  for (const name of ["calc.add", "text.echo"])
    await registry.register({
      name,
      description: `The ${name} tool.`,
      summary: `The ${name} tool.`,
      parameters: { type: "object", properties: {} },
      kind: "builtin",
      owner: "exec",
    });
  quotas = await QuotaStore.open(nc, { subjects: createSubjects({ prefix: "scan" }), replicas: 3 });
  await waitForStreamLeader(nc, QUOTAS_STREAM);
  await quotas.set({ tenant: "acme" }, { max_in_flight: 5 });
  await quotas.set({ tenant: "acme", tool: "calc.add" }, { rate: 2 });
  await quotas.set({ tenant: "globex" }, { max_in_flight: 9 });
  calls = await CallStore.open(nc, { subjects: createSubjects({ prefix: "scan" }), replicas: 3 });
  await waitForStreamLeader(nc, CALLS_STREAM);
  // The keys of call records (`{tenant}.{session}.{call}`); what they hold is not read.
  const records = await new Kvm(nc).open(createSubjects({ prefix: "scan" }).callsBucket);
  for (const key of ["acme.c1.c1", "acme.s.c2", "acme.c3.c3", "globex.c4.c4"])
    await records.put(key, "{}");
  await records.delete("acme.c3.c3");
}, 60_000);

afterAll(async () => {
  registry?.close();
  await nc?.close().catch(() => undefined);
  await cluster?.stop();
});

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

describe("scanBucket", () => {
  it("lists the keys holding a value, their latest values and revisions, with a node of the cluster down", async () => {
    const kv = await new Kvm(nc).create("scan", { replicas: 3, history: 5 });
    // A new bucket's stream takes writes once its leader is elected (2.15 answers the create
    // before).
    await waitForStreamLeader(nc, "KV_scan");
    await kv.put("t1.s.a", "a1");
    const a2 = await kv.put("t1.s.a", "a2");
    await kv.put("t1.s.gone", "x");
    await kv.delete("t1.s.gone");
    await kv.put("t1.s.purged", "y");
    await kv.purge("t1.s.purged");
    const b = await kv.put("t2.s.b", "b1");
    const jsm = await jetstreamManager(nc);

    const leader = await waitForStreamLeader(nc, "KV_scan");
    await cluster.node(leader).kill();
    await waitForStreamLeader(nc, "KV_scan", 60_000, leader);

    for (let i = 0; i < 10; i++) {
      const all = await scanBucket(jsm, "scan");
      expect(all.map((e) => [e.key, text(e.value), e.revision])).toEqual([
        ["t1.s.a", "a2", a2],
        ["t2.s.b", "b1", b],
      ]);
      const one = await scanBucket(jsm, "scan", "t1.>");
      expect(one.map((e) => e.key)).toEqual(["t1.s.a"]);
    }
    expect(await scanBucket(jsm, "scan", "t3.>")).toEqual([]);
  }, 120_000);

  it("lets the registry list every tool with a node of the cluster down", async () => {
    // Without a watcher the registry reads the bucket: a key listing failed there. Its bucket
    // may have lost its leader with the node: read once one is elected.
    await waitForStreamLeader(
      nc,
      `KV_${createSubjects({ prefix: "scan" }).registryBucket}`,
      60_000,
    );
    for (let i = 0; i < 10; i++)
      expect((await registry.fetchAll()).map((d) => d.name)).toEqual(["calc.add", "text.echo"]);
  }, 60_000);

  it("lets an operator list quotas with a node of the cluster down", async () => {
    await waitForStreamLeader(nc, QUOTAS_STREAM, 60_000);
    for (let i = 0; i < 10; i++) {
      expect((await quotas.list()).map((q) => q.key)).toEqual([
        "acme",
        "acme.tool.calc=2eadd",
        "globex",
      ]);
      expect((await quotas.list("acme")).map((q) => [q.key, q.quota])).toEqual([
        ["acme", { max_in_flight: 5 }],
        ["acme.tool.calc=2eadd", { rate: 2 }],
      ]);
    }
  }, 60_000);

  it("lets the gateway list a tenant's calls with a node of the cluster down", async () => {
    await waitForStreamLeader(nc, CALLS_STREAM, 60_000);
    for (let i = 0; i < 10; i++) {
      const listed = await calls.callsOf("acme");
      expect(listed.sort((a, b) => a.key.localeCompare(b.key))).toEqual([
        { session: "c1", key: "c1" },
        { session: "s", key: "c2" },
      ]);
    }
  }, 120_000);
});
