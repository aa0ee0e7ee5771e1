import type { JetStreamClient, JsMsg } from "@nats-io/jetstream";
import type { Semaphore } from "./semaphore.js";

/** Options of {@link startWorkLoop}. */
export interface WorkLoopOptions {
  js: JetStreamClient;
  stream: string;
  /** Durable pull consumer shared by every replica. */
  consumer: string;
  /** Bounds how many messages run at once; may be shared by several loops. */
  slots: Semaphore;
  /** Messages buffered per pull. Default 8. */
  maxMessages?: number;
  /** Handles one message and settles it (ack, nak or term). Must not throw. */
  handle(msg: JsMsg): Promise<void>;
  /** Told about handler failures and consumer notifications that need attention. */
  onError(err: unknown, msg?: JsMsg): void;
}

/** A running consumption loop. */
export interface WorkLoop {
  /** Stops pulling, waits for running handlers (at most `graceMs`, default 10 s). */
  stop(graceMs?: number): Promise<void>;
  /** How many handlers run right now. */
  readonly inFlight: number;
}

/**
 * Consumes a durable pull consumer with bounded concurrency. Every replica running the same
 * loop competes for the same messages, so adding replicas adds throughput.
 */
export async function startWorkLoop(options: WorkLoopOptions): Promise<WorkLoop> {
  const consumer = await options.js.consumers.get(options.stream, options.consumer);
  const messages = await consumer.consume({ max_messages: options.maxMessages ?? 8 });
  const running = new Set<Promise<void>>();
  let stopping = false;

  const pump = (async () => {
    for await (const msg of messages) {
      await options.slots.acquire();
      if (stopping) {
        options.slots.release();
        msg.nak();
        continue;
      }
      const task: Promise<void> = options
        .handle(msg)
        .catch((err: unknown) => options.onError(err, msg))
        .finally(() => {
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
    async stop(graceMs = 10_000) {
      stopping = true;
      await messages.close().catch(() => undefined);
      await pump;
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, graceMs);
      });
      await Promise.race([Promise.allSettled([...running]), grace]);
      clearTimeout(timer);
    },
  };
}
