import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import type { StreamSpec } from "@toolmesh/nats";
import { ensureStream } from "@toolmesh/nats";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";

// Services that start together each make the streams they need: a stream some of them add
// subjects to (the calls stream) is created by several at once, with other subjects. nats-server
// 2.9 answers one of those creates "subjects overlap with an existing stream" (1 in ~50 rounds of
// six), which stopped a service at startup.

const ROUNDS = 300;
const PROCESSES = 6;
let server: NatsServerHandle;
const connections: NatsConnection[] = [];

beforeAll(async () => {
  server = await startNatsServer();
  for (let i = 0; i < PROCESSES; i++) connections.push(await connect({ servers: server.url }));
}, 30_000);

afterAll(async () => {
  await Promise.all(connections.map((nc) => nc.close()));
  await server?.stop();
});

describe("a stream created by several processes at once", () => {
  it("is created, and no process fails", async () => {
    const managers = await Promise.all(connections.map((nc) => jetstreamManager(nc)));
    const spec = (round: number, i: number): StreamSpec => ({
      kind: "stream",
      name: `RACE_${round}`,
      addsSubjects: true,
      settings: {},
      config: {
        name: `RACE_${round}`,
        subjects: i % 2 === 0 ? [`race.${round}.a.>`] : [`race.${round}.a.>`, `race.${round}.b.>`],
        storage: "file",
        num_replicas: 1,
      },
    });
    const failed: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const outcomes = await Promise.allSettled(
        managers.map((jsm, i) => ensureStream(jsm, spec(round, i))),
      );
      for (const o of outcomes) if (o.status === "rejected") failed.push(String(o.reason));
    }
    expect(failed).toEqual([]);
    const names = [];
    for await (const name of (managers[0] as (typeof managers)[0]).streams.names())
      names.push(name);
    expect(names.filter((n) => n.startsWith("RACE_"))).toHaveLength(ROUNDS);
  }, 120_000);
});
