import { Defaults } from "@toolmesh/protocol";

/** Most aborted call keys remembered; past it the oldest are forgotten. */
const REMEMBERED_ABORTS = 4_096;
/** Aborted call keys are remembered this many windows. */
const ABORT_MEMORY_WINDOWS = 10;

/** What {@link FreshWork.trusts} looks at in one delivery. Times in ms. */
export interface Delivery {
  /** The work consumer it came from (one per tool). */
  consumer: string;
  /** Call key of its call. */
  key: string;
  /** Stream sequence of the work message. */
  seq: number;
  /** Messages left for the consumer when this one was delivered. */
  pending: number;
  /** JetStream delivery count, from 1. */
  deliveryCount: number;
  /** Server clock now minus the message's stored time. */
  ageMs: number;
}

/**
 * Decides when an executor may run a call's first delivery without reading its record first,
 * trusting the record revision the resolver sent with the work (ADR 0027). The read only ever
 * caught a call that ended while queued: cancelled or past its deadline, each of which this
 * process hears of on the abort broadcast. So a delivery is trusted only when that broadcast
 * would have reached this process: the message is young (queued less than the window), the
 * process has listened for longer than that, after its consumer was once drained (so the
 * message was stored after the process started listening, whatever its clock estimate says),
 * and the call is not among the calls recently aborted.
 */
export class FreshWork {
  /** The window, in ms. */
  readonly windowMs: number;
  // Local time from which every abort broadcast reached this process and is still remembered.
  #listeningSince: number | undefined;
  readonly #aborted = new Map<string, number>();
  // By consumer: sequence of a delivery after which the consumer had nothing left.
  readonly #drainedAt = new Map<string, number>();

  /** @param windowMs default {@link Defaults.freshWorkWindowMs} */
  constructor(windowMs: number = Defaults.freshWorkWindowMs) {
    this.windowMs = windowMs;
  }

  /** The abort subscription is in place (the server confirmed it) at local time `localMs`. */
  listening(localMs: number = Date.now()): void {
    this.#listeningSince = localMs;
  }

  /**
   * The connection to the server dropped. Aborts broadcast meanwhile are lost, and a server that
   * restarted may deliver again, as first deliveries, messages it had already delivered and had
   * acknowledged: trust nothing until listening again, a window long, after a new drain.
   */
  disconnected(): void {
    this.#listeningSince = undefined;
    this.#drainedAt.clear();
  }

  /**
   * A consumer failed (missed heartbeats, a stream that moved or restarted elsewhere in a
   * cluster): as after a reconnection, trust again only a window after `localMs` and a new drain.
   */
  interrupted(localMs: number = Date.now()): void {
    this.#drainedAt.clear();
    if (this.#listeningSince !== undefined) this.#listeningSince = localMs;
  }

  /** The abort broadcast named the call `key` at local time `localMs`. */
  aborted(key: string, localMs: number = Date.now()): void {
    this.#aborted.delete(key);
    this.#aborted.set(key, localMs);
    const expired = localMs - ABORT_MEMORY_WINDOWS * this.windowMs;
    for (const [oldest, at] of this.#aborted) {
      if (this.#aborted.size <= REMEMBERED_ABORTS && at > expired) break;
      this.#aborted.delete(oldest);
      // What was heard until then is forgotten: trust as if listening began then.
      if (this.#listeningSince !== undefined)
        this.#listeningSince = Math.max(this.#listeningSince, at);
    }
  }

  /**
   * Whether `delivery` may run on the revision its message carries, without a read. Call it for
   * every delivery: the first one after listening began with nothing pending marks its consumer
   * drained.
   */
  trusts(delivery: Delivery, localMs: number = Date.now()): boolean {
    const since = this.#listeningSince;
    if (since === undefined) return false;
    let drainedAt = this.#drainedAt.get(delivery.consumer);
    if (drainedAt === undefined && delivery.pending === 0) {
      drainedAt = delivery.seq;
      this.#drainedAt.set(delivery.consumer, drainedAt);
      return false;
    }
    return (
      drainedAt !== undefined &&
      delivery.seq > drainedAt &&
      delivery.deliveryCount === 1 &&
      delivery.ageMs < this.windowMs &&
      localMs - since > this.windowMs &&
      !this.#aborted.has(delivery.key)
    );
  }
}
