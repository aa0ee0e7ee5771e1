import type { NatsConnection, Subscription } from "@nats-io/nats-core";
import type { ConsumerMessages, JetStreamClient, JsMsg } from "@nats-io/jetstream";
import { Defaults, consumerLeaderElectedAdvisory } from "@toolmesh/protocol";
import type { Semaphore } from "./semaphore.js";
import type { UnavailableKind } from "./unavailable.js";
import { retryWhileUnavailable } from "./unavailable.js";

/**
 * How often a work loop tells the server a message it holds is still owned (`heartbeatMs`) for
 * a consumer whose ack wait is `ackWaitMs`: a third of it, so two beats may be lost before the
 * server redelivers, and at least 250 ms. In ms.
 */
export function heartbeatMsFor(ackWaitMs: number): number {
  return Math.max(250, Math.floor(ackWaitMs / 3));
}

/** Options of {@link startWorkLoop}. Durations in ms. */
export interface WorkLoopOptions {
  js: JetStreamClient;
  stream: string;
  /** Durable pull consumer shared by every replica. */
  consumer: string;
  /**
   * Read push consumers instead of pulling `consumer`: every consumer delivering to the literal
   * subject `deliverSubject` (several may share it, such as every tenant's calls stream's,
   * ADR 0048; the server matches a push consumer's interest by its subject as written, so a
   * wildcard subscription would receive nothing) in queue group `deliverGroup`, so every
   * replica running the same loop shares their messages. One subscription, whatever the number
   * of consumers; `stream` and `consumer` then only name the loop. Each message is kept owned
   * (`heartbeatMs`) from its arrival while it waits for a slot.
   */
  push?: { deliverSubject: string; deliverGroup: string };
  /** Bounds how many messages run at once; may be shared by several loops. */
  slots: Semaphore;
  /**
   * Messages a loop asks for ahead of its handlers. It asks again once a quarter of them are
   * left, so a pull serves about three quarters of this many calls. Default 8.
   */
  maxMessages?: number;
  /**
   * How long one pull request lives, in ms: an idle consumer sends one pull per this long.
   * Default `Defaults.pullExpiresMs` (5 s).
   */
  pullExpiresMs?: number;
  /**
   * Idle heartbeats of a waiting pull, in ms. A pull lost with its server (a killed cluster
   * node, a dropped leaf connection) is noticed after two missed heartbeats and made again, so
   * this, not the expiry, bounds how long a consumer stays deaf. Default
   * `Defaults.pullHeartbeatMs` (2.5 s).
   */
  pullHeartbeatMs?: number;
  /**
   * While a message waits for a slot or is being handled, tell the server every this many ms
   * that it is still owned (`working()`), so it is not redelivered elsewhere. Set it below
   * the consumer's ack wait; default off.
   */
  heartbeatMs?: number;
  /**
   * How long to keep trying to read the consumer while it cannot be read for a passing reason
   * (a leader being elected: timeouts, 503, a consumer just created), in ms. Default
   * `Defaults.startupTimeoutMs` (2 min).
   */
  consumerWaitMs?: number;
  /** Told once per kind of passing trouble met while reading the consumer, before trying again. */
  onConsumerUnavailable?: (kind: UnavailableKind, err: unknown) => void;
  /** Handles one message and settles it (ack, nak or term). What it throws goes to `onError`. */
  handle(msg: JsMsg): Promise<void>;
  /** Told about handler failures and consumer errors that need attention. */
  onError(err: unknown, msg?: JsMsg): void;
}

/**
 * Redelivery delay of a message handed back while stopping. Not zero: this loop's pull is still
 * open while it stops, and a message handed back at once could bounce straight back to it. Longer
 * than {@link SETTLE_QUIET_MS}, so the loop has unsubscribed when it is delivered again.
 */
const HAND_BACK_DELAY_MS = 500;
// After the handlers returned, how long no message may have arrived before the loop
// unsubscribes, and the most it waits for that.
const SETTLE_QUIET_MS = 200;
const SETTLE_MAX_MS = 1_000;

/** A running consumption loop. */
export interface WorkLoop {
  /**
   * Stops starting handlers, hands back (naks) every message received but not started, and
   * waits for running handlers. When `graceMs` (default 10 s) passes first, calls
   * `onGraceExpired` (which should make the handlers hand their messages back) and waits for
   * the handlers to return. Unsubscribes last, once nothing can be handed back any more.
   */
  stop(graceMs?: number, onGraceExpired?: () => void): Promise<void>;
  /** How many handlers run right now. */
  readonly inFlight: number;
}

/**
 * Consumes a durable pull consumer with bounded concurrency. Every replica running the same
 * loop competes for the same messages, so adding replicas adds throughput.
 */
export async function startWorkLoop(options: WorkLoopOptions): Promise<WorkLoop> {
  const messages =
    options.push === undefined
      ? await pullMessages(options)
      : await options.js.consumers
          .getBoundPushConsumer({
            deliver_subject: options.push.deliverSubject,
            deliver_group: options.push.deliverGroup,
          })
          .then((consumer) => consumer.consume());
  const leaderMoved =
    options.push === undefined ? pullAgainOnNewLeader(options, messages) : undefined;
  return new ConsumingWorkLoop(options, messages, leaderMoved);
}

/** A work loop taking messages from its consumer: its handlers running, and how it stops. */
class ConsumingWorkLoop implements WorkLoop {
  readonly #options: WorkLoopOptions;
  readonly #messages: ConsumerMessages;
  readonly #leaderMoved: Subscription | undefined;
  readonly #running = new Set<Promise<void>>();
  #stopping = false;
  #lastArrival = 0;
  readonly #signalStop: () => void;
  readonly #stopRequested: Promise<void>;
  readonly #pump: Promise<void>;

  /** Starts taking messages from `messages` at once. */
  constructor(
    options: WorkLoopOptions,
    messages: ConsumerMessages,
    leaderMoved: Subscription | undefined,
  ) {
    this.#options = options;
    this.#messages = messages;
    this.#leaderMoved = leaderMoved;
    let signalStop: () => void = () => undefined;
    this.#stopRequested = new Promise<void>((resolve) => (signalStop = resolve));
    this.#signalStop = signalStop;
    this.#pump = this.#consume().catch((err: unknown) => this.#options.onError(err));
  }

  /** How many handlers run right now. */
  get inFlight(): number {
    return this.#running.size;
  }

  /** Keeps `msg` owned (`heartbeatMs`) until the returned function is called; off without it. */
  #heartbeat(msg: JsMsg): () => void {
    if (this.#options.heartbeatMs === undefined) return () => undefined;
    const timer = setInterval(() => msg.working(), this.#options.heartbeatMs);
    return () => clearInterval(timer);
  }

  /** Waits for a slot; false once stopping begins first (a slot won later is given back). */
  async #slotUnlessStopping(): Promise<boolean> {
    const { slots } = this.#options;
    const acquired = slots.acquire();
    const won = await Promise.race([
      acquired.then(() => true),
      this.#stopRequested.then(() => false),
    ]);
    if (!won) void acquired.then(() => slots.release());
    return won;
  }

  /** Waits for a slot and starts handling `msg`; resolves once it started or was handed back. */
  async #start(msg: JsMsg, stopBeating: () => void): Promise<void> {
    const options = this.#options;
    const slot = await this.#slotUnlessStopping();
    if (!slot || this.#stopping) {
      if (slot) options.slots.release();
      stopBeating();
      msg.nak(HAND_BACK_DELAY_MS);
      return;
    }
    // Even a handler that throws before returning its promise only reaches onError.
    const task: Promise<void> = Promise.resolve()
      .then(() => options.handle(msg))
      .catch((err: unknown) => options.onError(err, msg))
      .finally(() => {
        stopBeating();
        options.slots.release();
        this.#running.delete(task);
      });
    this.#running.add(task);
  }

  /** Takes every message as it arrives: started when a slot frees, handed back once stopping. */
  async #consume(): Promise<void> {
    for await (const msg of this.#messages) {
      // Stopping: whatever did not start goes back at once, so another replica can run it.
      if (this.#stopping) {
        this.#lastArrival = Date.now();
        msg.nak(HAND_BACK_DELAY_MS);
        continue;
      }
      const stopBeating = this.#heartbeat(msg);
      // A pull asks for more only as this loop takes messages: wait for the slot before taking
      // the next. A push consumer sends up to its max_ack_pending whatever this loop does: each
      // message waits for its slot on its own, owned (heartbeat) from its arrival, so none waits
      // out its ack wait in a buffer.
      if (this.#options.push === undefined) await this.#start(msg, stopBeating);
      else void this.#start(msg, stopBeating);
    }
  }

  /** Stops as {@link WorkLoop.stop} says: hands back, waits for the handlers, unsubscribes last. */
  async stop(
    graceMs: number = Defaults.shutdownGraceMs,
    onGraceExpired?: () => void,
  ): Promise<void> {
    this.#stopping = true;
    this.#signalStop();
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(true), graceMs);
    });
    const finished = Promise.allSettled([...this.#running]).then(() => false);
    if (await Promise.race([finished, expired])) {
      onGraceExpired?.();
      await Promise.allSettled([...this.#running]);
    }
    clearTimeout(timer);
    // What the handlers handed back is delivered again at once, maybe to this loop's own pull:
    // bounce it (delivered again after the delay, when this loop no longer pulls) while still
    // subscribed, until none came for a while. A message arriving after the unsubscribe would
    // be dropped here and wait out its ack wait.
    const settleFrom = Date.now();
    this.#lastArrival = Math.max(this.#lastArrival, settleFrom);
    while (
      Date.now() - this.#lastArrival < SETTLE_QUIET_MS &&
      Date.now() - settleFrom < SETTLE_MAX_MS
    )
      await new Promise((resolve) => setTimeout(resolve, 25));
    // Unsubscribed only now: the server keeps an unsubscribed pull request alive until it
    // expires and (on 2.9) delivers redeliveries into it, so messages the handlers handed back
    // after an early unsubscribe would wait out the ack wait instead of going to a replica.
    this.#leaderMoved?.unsubscribe();
    await this.#messages.close().catch(() => undefined);
    await this.#pump;
  }
}

/** The messages of the durable pull consumer `options.consumer`, waiting out elections. */
async function pullMessages(options: WorkLoopOptions): Promise<ConsumerMessages> {
  const consumer = await retryWhileUnavailable(
    () => options.js.consumers.get(options.stream, options.consumer),
    {
      what: `read consumer ${options.consumer} of stream ${options.stream}`,
      ...(options.consumerWaitMs === undefined ? {} : { budgetMs: options.consumerWaitMs }),
      ...(options.onConsumerUnavailable === undefined
        ? {}
        : { onRetry: options.onConsumerUnavailable }),
    },
  );
  const maxMessages = options.maxMessages ?? 8;
  return consumer.consume({
    max_messages: maxMessages,
    expires: options.pullExpiresMs ?? Defaults.pullExpiresMs,
    idle_heartbeat: options.pullHeartbeatMs ?? Defaults.pullHeartbeatMs,
    // Ask again when a quarter is left; nats.js's default (three quarters) pulls about every
    // second call.
    threshold_messages: Math.max(1, Math.floor(maxMessages / 4)),
    // Pull again at once after a reconnect or missed heartbeats. Without it nats.js first asks
    // for the consumer's info, and while that fails (an election after a server left) it waits a
    // whole `expires` before asking again: seconds in which the consumer pulls nothing.
    bind: true,
  });
}

/**
 * A pull request lives on the consumer's leader: when the leader steps down, stops or dies, the
 * pull is gone, and nats.js pulls again only after two missed heartbeats. The server announces
 * the consumer's new leader; pull again then, at once. (Needs the right to subscribe to the
 * advisory; without it the heartbeats still recover the pull.)
 */
function pullAgainOnNewLeader(
  options: WorkLoopOptions,
  messages: ConsumerMessages,
): Subscription | undefined {
  const nc = (options.js as unknown as { nc?: NatsConnection }).nc;
  const repull = (messages as unknown as { resetPending?: () => Promise<boolean> }).resetPending;
  if (nc === undefined || repull === undefined) return undefined;
  return nc.subscribe(consumerLeaderElectedAdvisory(options.stream, options.consumer), {
    callback: (err) => {
      if (err === null) void repull.call(messages).catch(() => undefined);
    },
  });
}
