/**
 * How a toolmesh connection follows its servers going away (`followServerChanges`,
 * docs/adr/0042-calls-keep-moving-through-server-restarts.md), against real servers: requests
 * whose reply cannot come fail at once instead of waiting out their timeout, and a lame duck is
 * left before it closes anyone. `test/cluster.test.ts` measures what this does for calls.
 */
import { afterAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { TimeoutError } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { AckPolicy, RetentionPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { ToolmeshClient } from "@toolmesh/client";
import { Semaphore, connectNats, startWorkLoop } from "@toolmesh/nats";
import {
  STREAM_LEADER_ELECTED_ADVISORIES,
  consumerLeaderElectedAdvisory,
} from "@toolmesh/protocol";
import { startNatsServer, stopAll } from "./helpers/nats-server.js";

const open: NatsConnection[] = [];
afterAll(async () => {
  await Promise.all(open.map((nc) => nc.close().catch(() => undefined)));
  await stopAll();
});

/** A request nobody answers (a subscriber keeps it): when it settled, and how. */
async function unanswered(
  nc: NatsConnection,
  subject: string,
): Promise<{ settled: Promise<{ at: number; err: unknown }> }> {
  const settled = nc.request(subject, "x", { timeout: 20_000 }).then(
    () => ({ at: performance.now(), err: undefined as unknown }),
    (err: unknown) => ({ at: performance.now(), err }),
  );
  await nc.flush();
  return { settled };
}

/** Resolves at the connection's next status event of `type`. */
function nextStatus(nc: NatsConnection, type: string): Promise<void> {
  return (async () => {
    for await (const s of nc.status()) if (s.type === type) return;
  })();
}

describe("a toolmesh connection", () => {
  it("fails a request waiting when its server goes away at once, as its timeout would", async () => {
    const server = await startNatsServer({ jetstream: false });
    const nc = await connectNats({ servers: server.url });
    open.push(nc);
    nc.subscribe("held", { callback: () => undefined });
    const waiting = await unanswered(nc, "held");
    const stopped = performance.now();
    await server.terminate();
    const { at, err } = await waiting.settled;
    expect(err).toBeInstanceOf(TimeoutError);
    expect(at - stopped).toBeLessThan(5_000);
  });

  it("fails a request made while disconnected once it is back, as its timeout would: it was never sent", async () => {
    const server = await startNatsServer({ jetstream: false });
    const nc = await connectNats({ servers: server.url });
    open.push(nc);
    const disconnected = nextStatus(nc, "disconnect");
    await server.kill();
    await disconnected;
    // Written while no server was there: nats.js discards it when it dials again.
    const lost = nc.request("echo", "x", { timeout: 20_000 }).then(
      () => ({ at: performance.now(), err: undefined as unknown }),
      (err: unknown) => ({ at: performance.now(), err }),
    );
    // nats.js discards what was written while disconnected at its next dial attempt.
    await nextStatus(nc, "reconnecting");
    await server.restart();
    const responder = await connect({ servers: server.url });
    open.push(responder);
    responder.subscribe("echo", {
      callback: (_e, m) => {
        m.respond(m.data);
      },
    });
    await responder.flush();
    const back = performance.now();
    const { at, err } = await lost;
    expect(err).toBeInstanceOf(TimeoutError);
    expect(at - back).toBeLessThan(5_000);
    // What is asked once it is back is answered.
    await nc.flush();
    await expect(nc.request("echo", "y", { timeout: 5_000 })).resolves.toBeDefined();
  });

  it("has a client fail only its own calls' publishes made while disconnected, not its user's requests", async () => {
    const server = await startNatsServer();
    const nc = await connect({
      servers: server.url,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 100,
    });
    open.push(nc);
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({ name: "CALLS_HERE", subjects: ["toolmesh.v1.calls.>"] });
    const client = new ToolmeshClient(nc);
    const disconnected = nextStatus(nc, "disconnect");
    await server.kill();
    await disconnected;
    const session = client.session("while-down");
    session.submit({ id: "c1", name: "anything", arguments: {} }, { timeoutMs: 60_000 });
    const made = performance.now();
    const own = nc.request("echo", "x", { timeout: 3_000 }).then(
      () => ({ at: performance.now(), err: undefined as unknown }),
      (err: unknown) => ({ at: performance.now(), err }),
    );
    // nats.js discards what was written while disconnected at its next dial attempt.
    await nextStatus(nc, "reconnecting");
    const back = nextStatus(nc, "reconnect");
    await server.restart();
    await back;
    // The call, published again once the connection is back, is stored.
    await expect
      .poll(async () => (await jsm.streams.info("CALLS_HERE")).state.messages, { timeout: 10_000 })
      .toBe(1);
    // The user's own request is left to its own timeout.
    const { at, err } = await own;
    expect(err).toBeInstanceOf(TimeoutError);
    expect(at - made).toBeGreaterThanOrEqual(2_900);
    session.close();
  });

  it("fails requests still waiting shortly after a stream elected a new leader", async () => {
    const server = await startNatsServer({ jetstream: false });
    const nc = await connectNats({ servers: server.url });
    const other = await connect({ servers: server.url });
    open.push(nc, other);
    other.subscribe("held", { callback: () => undefined });
    await other.flush();
    const waiting = await unanswered(nc, "held");
    const advisory = STREAM_LEADER_ELECTED_ADVISORIES.replace(">", "CALLS");
    const sent = performance.now();
    other.publish(advisory, JSON.stringify({ stream: "CALLS", leader: "n2" }));
    const { at, err } = await waiting.settled;
    expect(err).toBeInstanceOf(TimeoutError);
    // Not at once: an answer on its way gets a moment.
    expect(at - sent).toBeGreaterThanOrEqual(200);
    expect(at - sent).toBeLessThan(5_000);
    // A request made after the announcement arrived is left alone, however slow its answer.
    other.subscribe("slow", {
      callback: (_e, m) => {
        setTimeout(() => m.respond("ok"), 400);
      },
    });
    await other.flush();
    other.publish(advisory, "{}");
    await other.flush();
    await nc.flush();
    await expect(nc.request("slow", "x", { timeout: 5_000 })).resolves.toBeDefined();
    // Nor is a change of a stream or consumer, which the meta leader may rightly take seconds for.
    other.subscribe("$JS.API.STREAM.UPDATE.CALLS", {
      callback: (_e, m) => {
        setTimeout(() => m.respond("{}"), 600);
      },
    });
    await other.flush();
    const update = nc.request("$JS.API.STREAM.UPDATE.CALLS", "{}", { timeout: 5_000 });
    await nc.flush();
    other.publish(advisory, "{}");
    await expect(update).resolves.toBeDefined();
  });

  it("moves to another server as soon as its server enters lame-duck mode", async () => {
    const config = "lame_duck_duration: 30s\nlame_duck_grace_period: 10s\n";
    const first = await startNatsServer({ jetstream: false, config });
    const second = await startNatsServer({ jetstream: false, config });
    const nc = await connectNats({ servers: `${first.url},${second.url}` });
    open.push(nc);
    const start = nc.getServer();
    const ducking = start.endsWith(`:${first.port}`) ? first : second;
    const moved = (async () => {
      for await (const s of nc.status()) if (s.type === "reconnect") return performance.now();
      return Infinity;
    })();
    const signalled = performance.now();
    void ducking.lameDuck();
    // Within the 10 s grace period, when the server has closed nobody yet.
    expect((await moved) - signalled).toBeLessThan(5_000);
    expect(nc.getServer()).not.toBe(start);
    await ducking.kill();
  });

  it("pulls again at once when its consumer's new leader is announced", async () => {
    const server = await startNatsServer();
    const nc = await connectNats({ servers: server.url });
    const other = await connect({ servers: server.url });
    open.push(nc, other);
    const jsm = await jetstreamManager(other);
    await jsm.streams.add({ name: "SC", subjects: ["sc.>"], retention: RetentionPolicy.Workqueue });
    await jsm.consumers.add("SC", { durable_name: "work", ack_policy: AckPolicy.Explicit });
    // Every pull request the loop makes, seen by a second subscriber of the API subject.
    const pulls: number[] = [];
    other.subscribe("$JS.API.CONSUMER.MSG.NEXT.SC.work", {
      callback: () => {
        pulls.push(performance.now());
      },
    });
    await other.flush();
    const loop = await startWorkLoop({
      js: jetstream(nc),
      stream: "SC",
      consumer: "work",
      slots: new Semaphore(4),
      handle: async (msg) => msg.ack(),
      onError: () => undefined,
    });
    while (pulls.length === 0) await new Promise((resolve) => setTimeout(resolve, 20));
    const before = pulls.length;
    const announced = performance.now();
    other.publish(consumerLeaderElectedAdvisory("SC", "work"), "{}");
    while (pulls.length === before && performance.now() - announced < 2_000)
      await new Promise((resolve) => setTimeout(resolve, 20));
    // Well before two missed heartbeats (1 s apart) or the pull's expiry (5 s).
    expect((pulls[before] ?? Infinity) - announced).toBeLessThan(500);
    await loop.stop();
  });
});
