import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { nanos } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { JetStreamClient, JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { AckPolicy, RetentionPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Semaphore, startWorkLoop } from "@toolmesh/nats";
import type { WorkLoop, WorkLoopOptions } from "@toolmesh/nats";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { until } from "./helpers/eventually.js";

// The loop every executor and the schema expander consume work with: bounded concurrency over
// a durable pull consumer on a work-queue stream, heartbeats, and stop with grace and hand-back.
let server: NatsServerHandle;
let nc: NatsConnection;
let js: JetStreamClient;
let jsm: JetStreamManager;
let nextQueue = 0;
const loops: WorkLoop[] = [];

/** A work-queue stream with one durable pull consumer, as production provisions them. */
async function queue(ackWaitMs = 30_000): Promise<{ stream: string; consumer: string }> {
  const stream = `WL_${++nextQueue}`;
  await jsm.streams.add({
    name: stream,
    subjects: [`wl.${nextQueue}`],
    retention: RetentionPolicy.Workqueue,
  });
  await jsm.consumers.add(stream, {
    durable_name: "work",
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(ackWaitMs),
  });
  return { stream, consumer: "work" };
}

async function publish(stream: string, count: number): Promise<void> {
  const subject = `wl.${stream.slice(3)}`;
  await Promise.all(Array.from({ length: count }, (_, i) => js.publish(subject, `${i}`)));
}

type LoopOptions = Partial<WorkLoopOptions> & Pick<WorkLoopOptions, "handle">;

async function loop(where: { stream: string; consumer: string }, opts: LoopOptions) {
  const started = await startWorkLoop({
    js,
    ...where,
    slots: new Semaphore(4),
    onError: () => undefined,
    ...opts,
  });
  loops.push(started);
  return started;
}

/** Polls often: the work loop's states last milliseconds. */
const POLL = { timeoutMs: 10_000, everyMs: 20 };

/** A promise with its resolver: a gate a handler waits on. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

const payload = (msg: JsMsg): string => msg.string();

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
  js = jetstream(nc);
  jsm = await jetstreamManager(nc);
});

afterAll(async () => {
  // A loop a failed test left with a blocked handler would never stop; the server goes anyway.
  const stopped = Promise.all(loops.map((l) => l.stop(0)));
  await Promise.race([stopped, new Promise((resolve) => setTimeout(resolve, 2_000))]);
  await nc.close();
  await server.stop();
});

describe("startWorkLoop", () => {
  it("never runs more handlers than the slots two loops share", async () => {
    const where = await queue();
    const slots = new Semaphore(3);
    let running = 0;
    let most = 0;
    const handled: string[] = [];
    const handle = async (msg: JsMsg): Promise<void> => {
      running++;
      most = Math.max(most, running);
      await new Promise((resolve) => setTimeout(resolve, 30));
      running--;
      handled.push(payload(msg));
      msg.ack();
    };
    await loop(where, { slots, handle });
    await loop(where, { slots, handle });
    await publish(where.stream, 24);
    await until("handled.length === 24", () => handled.length === 24, POLL);
    expect(most).toBe(3);
    expect(new Set(handled).size).toBe(24);
  });

  it("keeps a handler slower than the ack wait owning its message", async () => {
    const where = await queue(1_000);
    const deliveries: { payload: string; redelivered: boolean }[] = [];
    const handle = async (msg: JsMsg): Promise<void> => {
      deliveries.push({ payload: payload(msg), redelivered: msg.info.redelivered });
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      msg.ack();
    };
    // Two loops: a message whose ownership lapsed would be redelivered to the idle one.
    await loop(where, { handle, heartbeatMs: 300 });
    await loop(where, { handle, heartbeatMs: 300 });
    await publish(where.stream, 2);
    await until(
      "the work stream to hold 0 messages",
      async () => (await jsm.streams.info(where.stream)).state.messages === 0,
      POLL,
    );
    expect(deliveries.map((d) => d.payload).sort()).toEqual(["0", "1"]);
    expect(deliveries.every((d) => !d.redelivered)).toBe(true);
  });

  it("starts nothing after stop() and waits for the running handlers", async () => {
    const where = await queue();
    const release = gate();
    const handled: string[] = [];
    const worker = await loop(where, {
      handle: async (msg) => {
        await release.opened;
        handled.push(payload(msg));
        msg.ack();
      },
    });
    await publish(where.stream, 2);
    await until("worker.inFlight === 2", () => worker.inFlight === 2, POLL);
    let stopped = false;
    const stopping = worker.stop(30_000).then(() => (stopped = true));
    await publish(where.stream, 1);
    // stop() must not resolve while handlers run: an absence, given time to show.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(stopped).toBe(false);
    release.open();
    await stopping;
    expect(handled.sort()).toEqual(["0", "1"]);
    // The two acks reach the server; the third message stays for another replica.
    await until(
      "the work stream to hold 1 message",
      async () => (await jsm.streams.info(where.stream)).state.messages === 1,
      POLL,
    );
  });

  it("calls onGraceExpired when the grace passes, then waits for the handlers to hand back", async () => {
    const where = await queue();
    const abort = new AbortController();
    let returned = 0;
    const worker = await loop(where, {
      handle: async (msg) => {
        await new Promise((resolve) => abort.signal.addEventListener("abort", resolve));
        await new Promise((resolve) => setTimeout(resolve, 200));
        msg.nak();
        returned++;
      },
    });
    await publish(where.stream, 2);
    await until("worker.inFlight === 2", () => worker.inFlight === 2, POLL);
    const other = new Map<string, boolean>();
    await loop(where, {
      handle: async (msg) => {
        other.set(payload(msg), msg.info.redelivered);
        msg.ack();
      },
    });
    const began = Date.now();
    let expiredAfter = -1;
    await worker.stop(300, () => {
      expiredAfter = Date.now() - began;
      abort.abort();
    });
    expect(expiredAfter).toBeGreaterThanOrEqual(290);
    expect(returned).toBe(2);
    // Handed back to the other loop, well inside the 30 s ack wait.
    await until("other.size === 2", () => other.size === 2, { ...POLL, timeoutMs: 5_000 });
    expect([...other.values()]).toEqual([true, true]);
  });

  it("hands buffered messages back at once when stopping, to be run by another loop", async () => {
    const where = await queue();
    const release = gate();
    const first = await loop(where, {
      slots: new Semaphore(1),
      maxMessages: 8,
      handle: async (msg) => {
        await release.opened;
        msg.ack();
      },
    });
    await publish(where.stream, 5);
    // One runs, four wait in the loop's buffer for its only slot.
    await until(
      "one call running and four waiting",
      async () => {
        const info = await jsm.consumers.info(where.stream, where.consumer);
        return first.inFlight === 1 && info.num_ack_pending === 5;
      },
      POLL,
    );
    const stopping = first.stop(30_000);
    const other: string[] = [];
    await loop(where, {
      handle: async (msg) => {
        other.push(payload(msg));
        msg.ack();
      },
    });
    // Well inside the 30 s ack wait, and while the first loop's handler still runs.
    await until("other.length === 4", () => other.length === 4, { ...POLL, timeoutMs: 5_000 });
    expect(first.inFlight).toBe(1);
    release.open();
    await stopping;
  });

  it("reports a handler that throws and goes on consuming", async () => {
    const where = await queue();
    const errors: { err: unknown; msg?: JsMsg }[] = [];
    const handled: string[] = [];
    await loop(where, {
      slots: new Semaphore(1),
      // Not async: it throws before it returns a promise.
      handle: (msg) => {
        msg.ack();
        if (payload(msg) === "0") throw new Error("handler broke");
        handled.push(payload(msg));
        return Promise.resolve();
      },
      onError: (err, msg) => errors.push({ err, msg }),
    });
    await publish(where.stream, 3);
    await until("handled.length === 2", () => handled.length === 2, POLL);
    expect(errors).toHaveLength(1);
    expect((errors[0]?.err as Error).message).toBe("handler broke");
    expect(errors[0]?.msg && payload(errors[0].msg)).toBe("0");
  });

  it("waits for a consumer it cannot read yet, then consumes it", async () => {
    const where = await queue();
    await jsm.consumers.delete(where.stream, where.consumer);
    await publish(where.stream, 2);
    const handled: string[] = [];
    const unavailable: string[] = [];
    const starting = loop(where, {
      handle: (msg) => {
        handled.push(payload(msg));
        msg.ack();
        return Promise.resolve();
      },
      onConsumerUnavailable: (kind) => unavailable.push(kind),
    });
    await until("unavailable.length > 0", () => unavailable.length > 0, POLL);
    await jsm.consumers.add(where.stream, { durable_name: "work", ack_policy: AckPolicy.Explicit });
    await starting;
    await until("handled.length === 2", () => handled.length === 2, POLL);
    expect(unavailable).toEqual(["consumer not found"]);
  });

  it("gives up on a consumer of a stream that does not exist", async () => {
    await expect(
      loop({ stream: "WL_MISSING", consumer: "work" }, { handle: () => Promise.resolve() }),
    ).rejects.toThrow(/stream not found/);
  });

  it("reads push consumers sharing one deliver subject, keeping every message it holds owned until its turn", async () => {
    // Two streams whose consumers push to one literal subject, as every tenant's calls stream
    // does (ADR 0048), with an ack wait shorter than the queue of messages the loop holds.
    const deliver = `wl.push.${++nextQueue}`;
    const streams = [`WLP_${nextQueue}_A`, `WLP_${nextQueue}_B`];
    for (const [i, stream] of streams.entries()) {
      await jsm.streams.add({
        name: stream,
        subjects: [`wlp.${nextQueue}.${i}`],
        retention: RetentionPolicy.Workqueue,
      });
      await jsm.consumers.add(stream, {
        durable_name: "work",
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(1_000),
        deliver_subject: deliver,
        deliver_group: "work",
      });
    }
    const deliveries: { stream: string; payload: string; redelivered: boolean }[] = [];
    const handle = async (msg: JsMsg): Promise<void> => {
      deliveries.push({
        stream: msg.info.stream,
        payload: payload(msg),
        redelivered: msg.info.redelivered,
      });
      await new Promise((resolve) => setTimeout(resolve, 250));
      msg.ack();
    };
    // One slot: the last of 12 messages waits about 3 s, three ack waits, for its turn.
    await loop(
      { stream: "WLP_*", consumer: "work" },
      {
        handle,
        slots: new Semaphore(1),
        heartbeatMs: 300,
        push: { deliverSubject: deliver, deliverGroup: "work" },
      },
    );
    for (const [i] of streams.entries()) {
      await Promise.all(
        Array.from({ length: 6 }, (_, n) => js.publish(`wlp.${nextQueue}.${i}`, `${i}-${n}`)),
      );
    }
    await until("deliveries.length >= 12", () => deliveries.length >= 12, {
      ...POLL,
      timeoutMs: 20_000,
    });
    await until(
      "every stream to be empty",
      async () => {
        const states = await Promise.all(streams.map((st) => jsm.streams.info(st)));
        return states.every((info) => info.state.messages === 0);
      },
      { ...POLL, timeoutMs: 20_000 },
    );
    expect(deliveries.filter((d) => d.redelivered)).toEqual([]);
    expect(deliveries).toHaveLength(12);
    expect(new Set(deliveries.map((d) => d.stream))).toEqual(new Set(streams));
  });
});
