/**
 * An executor that starts while its tool's work consumer cannot be read (its only replica's
 * node is down, as during a consumer's leader election or a node's restart) keeps trying, not
 * ready, and serves calls once the consumer is back, without a restart.
 */
import type { NatsConnection } from "@nats-io/nats-core";
import { jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { connectNats } from "@toolmesh/nats";
import type { NatsClusterHandle } from "@toolmesh/nats-launcher";
import { freePort, stopAll, waitForStreamLeader } from "@toolmesh/nats-launcher";
import { createSubjects } from "@toolmesh/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "./helpers/cli.js";
import { fixtureTools, killAllServices, spawnService, startService } from "./helpers/mesh.js";
import { startTestCluster } from "./helpers/nats-server.js";

const TOOL = "concurrency";
let cluster: NatsClusterHandle;
let nc: NatsConnection;

beforeAll(async () => {
  cluster = await startTestCluster({
    size: 3,
  });
  nc = await connectNats({ servers: cluster.urls, name: "consumer-unavailable-test" });
}, 60_000);

afterAll(async () => {
  await nc?.close().catch(() => undefined);
  await killAllServices();
  await cluster?.stop();
  await stopAll();
});

const readyz = async (port: number): Promise<number> =>
  (await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined))?.status ?? 0;

describe("an executor whose work consumer cannot be read at start", () => {
  it("keeps trying, not ready, and serves calls once the consumer is back", async (ctx) => {
    const subjects = createSubjects();
    const env = {
      NATS_URL: cluster.urls,
      TOOLMESH_STREAM_REPLICAS: "3",
      TOOLMESH_TOOLS_DIR: fixtureTools("tools-c"),
    };
    const setup = await runCli(["setup"], env);
    expect(setup.code, setup.stderr).toBe(0);
    await startService("resolver", env);
    // A first executor creates the tool's work consumer.
    const first = await startService("executor", env);
    await first.kill();

    // The consumer again, with one replica on one node, so that node's absence leaves it
    // without a leader while every stream keeps one. nats-server 2.10 and later refuse a
    // consumer with fewer replicas than its work-queue stream: there the work loop's own test
    // (test/work-loop.test.ts, a consumer that cannot be read yet) covers the waiting.
    const jsm = await jetstreamManager(nc);
    const stream = subjects.streams.work;
    const name = subjects.workConsumer(TOOL);
    const { config } = await jsm.consumers.info(stream, name);
    await jsm.consumers.delete(stream, name);
    const info = await jsm.consumers
      .add(stream, { ...config, num_replicas: 1 })
      .catch((err: unknown) => {
        if (String(err).includes("replicas must match")) return undefined;
        throw err;
      });
    if (info?.cluster?.leader === undefined) {
      ctx.skip(
        "this nats-server refuses a work-queue consumer with fewer replicas than its stream",
      );
      return;
    }
    const streams: string[] = [];
    for await (const s of jsm.streams.names()) streams.push(s);
    const down = cluster.node(info.cluster.leader);
    await down.kill();
    const up = cluster.nodes.filter((n) => n !== down);
    // Every stream and the cluster's metadata are led by the nodes still up.
    const metaLeader = async (): Promise<string | undefined> => {
      const jsz = (await (await fetch(`${up[0]?.monitorUrl}/jsz`)).json()) as {
        meta_cluster?: { leader?: string };
      };
      return jsz.meta_cluster?.leader;
    };
    await expect
      .poll(
        async () => {
          const leader = await metaLeader();
          return up.some((n) => n.name === leader);
        },
        { timeout: 30_000 },
      )
      .toBe(true);
    for (const s of streams) await waitForStreamLeader(nc, s, 30_000, down.name);
    await expect(jsm.consumers.info(stream, name)).rejects.toThrow();

    const port = await freePort();
    const executor = spawnService("executor", {
      ...env,
      NATS_URL: up.map((n) => n.url).join(","),
      TOOLMESH_HEALTH_PORT: String(port),
    });
    // It meets the unreadable consumer, says so once, and keeps trying, alive and not ready.
    await executor.waitForLog(
      (l) => String(l.msg).startsWith("work consumer cannot be read yet"),
      30_000,
    );
    expect(await readyz(port)).toBe(503);

    await down.restart();
    await expect.poll(() => readyz(port), { timeout: 60_000 }).toBe(200);
    const session = new ToolmeshClient(nc).session("consumer-unavailable");
    const message = await session.submit({ id: "c1", name: TOOL, arguments: { hold_ms: 1 } })
      .result;
    session.close();
    expect(message.error).toBeUndefined();
    expect(JSON.parse(message.content)).toMatchObject({ pid: executor.pid });
    expect(
      executor.lines.filter((l) => String(l.msg).startsWith("work consumer cannot")),
    ).toHaveLength(1);
  }, 120_000);
});
