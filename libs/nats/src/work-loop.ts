import type { JetStreamClient, JsMsg } from "@nats-io/jetstream";
import type { Semaphore } from "./semaphore.js";

/** Options of {@link startWorkLoop}. Durations in ms. */
export interface WorkLoopOptions {
  js: JetStreamClient;
  stream: string;
  /** Durable pull consumer shared by every replica. */
  consumer: string;
  /** Bounds how many messages run at once; may be shared by several loops. */
  slots: Semaphore;
  /** Messages buffered per pull. Default 8. */
  maxMessages?: number;
  /**
   * How long one pull request lives, in ms; the server's idle heartbeats come every half of
   * it. A pull lost with its server (a killed cluster node, a dropped leaf connection) is noticed
   * after two missed heartbeats and made again, so this bounds how long a consumer stays deaf.
   * Default 5 000.
   */
  pullExpiresMs?: number;
  /**
   * While a message waits for a slot or is being handled, tell the server every this many ms
   * that it is still owned (`working()`), so it is not redelivered elsewhere. Set it below
   * the consumer's ack wait; default off.
   */
  heartbeatMs?: number;
  /** Handles one message and settles it (ack, nak or term). Must not throw. */
  handle(msg: JsMsg): Promise<void>;
  /** Told about handler failures and consumer errors that need attention. */
  onError(err: unknown, msg?: JsMsg): void;
}

/** A running consumption loop. */
export interface WorkLoop {
  /**
   * Stops pulling and waits for running handlers. When `graceMs` (default 10 s) passes first,
   * calls `onGraceExpired` (which should make the handlers hand their messages back) and
   * waits for the handlers to return.
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
  const consumer = await options.js.consumers.get(options.stream, options.consumer);
  const messages = await consumer.consume({
    max_messages: options.maxMessages ?? 8,
    expires: options.pullExpiresMs ?? 5_000,
  });
  const running = new Set<Promise<void>>();
  let stopping = false;

  const heartbeat = (msg: JsMsg): (() => void) => {
    if (options.heartbeatMs === undefined) return () => undefined;
    const timer = setInterval(() => msg.working(), options.heartbeatMs);
    return () => clearInterval(timer);
  };

  const pump = (async () => {
    for await (const msg of messages) {
      const stopBeating = heartbeat(msg);
      await options.slots.acquire();
      if (stopping) {
        stopBeating();
        options.slots.release();
        msg.nak();
        continue;
      }
      const task: Promise<void> = options
        .handle(msg)
        .catch((err: unknown) => options.onError(err, msg))
        .finally(() => {
          stopBeating();
          options.slots.release();
          running.delete(task);
        });
      running.add(task);
    }
  })().catch((err: unknown) => options.onError(err));

  return {
    get inFlight() {
      return running.size;
    },
    async stop(graceMs = 10_000, onGraceExpired) {
      stopping = true;
      await messages.close().catch(() => undefined);
      await pump;
      let timer: NodeJS.Timeout | undefined;
      const expired = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(true), graceMs);
      });
      const finished = Promise.allSettled([...running]).then(() => false);
      if (await Promise.race([finished, expired])) {
        onGraceExpired?.();
        await Promise.allSettled([...running]);
      }
      clearTimeout(timer);
    },
  };
}
